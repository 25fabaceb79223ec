"""``streamrec train``: the continuous trainer against the embedded broker or ``--bootstrap``.

SIGINT/SIGTERM make it finish the window in hand, write a final checkpoint,
commit its offsets and exit 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("train", parents=[common],
                       help="train continuously from the events topic (checkpoints, snapshots, metrics)")
    p.add_argument("--max-events", type=int, help="stop after this many events (trainer.max_events)")
    p.add_argument("--idle-exit", type=float, metavar="S", help="stop after S seconds without events (trainer.idle_exit_s)")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.serving import SnapshotPusher
    from streamrec.trainer import TrainerService

    cfg = config_from_args(args)
    if args.max_events is not None:
        cfg.trainer.max_events = args.max_events
    if args.idle_exit is not None:
        cfg.trainer.idle_exit_s = args.idle_exit
    stop = threading.Event()

    def on_signal(signum, _frame):
        if stop.is_set():  # second signal: give up on the clean drain
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with kafka_bootstrap(cfg) as bootstrap:
        svc = TrainerService(cfg, bootstrap, stop=stop, progress=False if args.no_progress else None,
                             pusher_factory=SnapshotPusher.factory(cfg))
        summary = svc.run()
    print(json.dumps({k: (v if v == v else None) for k, v in summary.items()}), flush=True)
    print(f"trainer stopped ({summary['reason']}): {summary['events']:,} events, checkpoint {summary['checkpoint']}",
          file=sys.stderr)
    return 0
