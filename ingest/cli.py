"""``streamrec broker`` (run the embedded broker) and ``streamrec produce`` (replay events into Kafka)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("broker", parents=[common], help="run the embedded Kafka-protocol broker until Ctrl-C")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.set_defaults(func=cmd_broker)


def cmd_broker(args) -> int:
    from streamrec.cli import config_from_args

    from . import EmbeddedBroker, ensure_topics, pipeline_topics

    cfg = config_from_args(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port) as broker:
        ensure_topics(broker.bootstrap, pipeline_topics(cfg))
        print(broker.bootstrap, flush=True)
        print(f"embedded broker on {broker.bootstrap}; Ctrl-C stops it", file=sys.stderr)
        try:
            while not stop.wait(0.5):
                if not broker.alive():
                    print("broker exited", file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            pass
    return 0
