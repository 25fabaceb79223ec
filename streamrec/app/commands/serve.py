"""``streamrec serve`` (run the gRPC endpoint) and ``streamrec predict`` (score JSON events)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="run the gRPC serving endpoint until Ctrl-C/SIGTERM")
    p.add_argument("--port", type=int, default=None, help="override serving.port (0 = a free one, printed)")
    p.add_argument("--device", default=None, help="cpu | cuda[:N] (default: trainer.device, auto)")
    p.add_argument("--snapshot", metavar="DIR", help="load this snapshot directory before serving")
    p.add_argument("--insecure-push", action="store_true",
                   help="start even with an empty serving.push_token on a non-loopback serving.host, i.e. let "
                        "anyone who reaches the port replace the model (warned on every start)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("predict", parents=[common], help="score JSON events (file or stdin) with a running server")
    p.add_argument("input", nargs="?", default="-",
                   help="file of events: a JSON array or one JSON object per line ('-' = stdin)")
    p.add_argument("--target", help="host:port (default: serving.target or serving.host:serving.port)")
    p.add_argument("--token", default=None, help="bearer token (default: serving.predict_token)")
    p.add_argument("--batch", type=int, default=512, help="events per request")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_predict)


def cmd_serve(args) -> int:
    from streamrec.app.cli import config_from_args
    from streamrec.serving import serve
    from streamrec.snapshot import SnapshotError, verify_snapshot

    cfg = config_from_args(args)
    server = serve(cfg, device=args.device, port=args.port, insecure_push=args.insecure_push)
    for w in server.warnings:  # also logged; printed so that no log setting hides them
        print(f"streamrec serve: WARNING: {w}", file=sys.stderr, flush=True)
    if args.snapshot:
        m = verify_snapshot(args.snapshot)
        try:
            server.service.install(Path(args.snapshot), m)
        except SnapshotError as e:  # e.g. a restart that already serves this version or a newer one
            print(f"--snapshot not loaded: {e}", file=sys.stderr)
    print(server.target, flush=True)
    print(f"serving on {server.target}; Ctrl-C stops it", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    server.stop(2.0)
    return 0


def read_events(path: str) -> list:
    """A JSON array, or JSON lines (one event per line); blank lines are skipped."""
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    text = text.removeprefix("\ufeff")  # a UTF-8 BOM (Windows editors) is not part of the JSON
    s = text.strip()
    if not s:
        return []
    if s.startswith("["):
        data = json.loads(s)
        if not isinstance(data, list):
            raise ValueError("expected a JSON array of events")
        return data
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n}: {e}") from None
    return out


def cmd_predict(args) -> int:
    import grpc

    from streamrec.app.cli import config_from_args

    from streamrec.serving import RequestError, ServingClient

    cfg = config_from_args(args)
    if args.batch < 1:  # 0 sent empty requests; a negative one sliced events[i:i-1] and skipped events
        print("streamrec predict: --batch must be >= 1", file=sys.stderr)
        return 2
    try:
        events = read_events(args.input)
    except (OSError, ValueError) as e:
        print(f"streamrec predict: {e}", file=sys.stderr)
        return 2
    token = cfg.serving.predict_token if args.token is None else args.token
    client = ServingClient(args.target or cfg.serving_target(), token=token, tls_ca=cfg.serving.tls_ca,
                           timeout=args.timeout, max_message_mb=cfg.serving.max_message_mb)
    try:
        for i in range(0, len(events), args.batch):
            chunk = events[i:i + args.batch]
            scores, version = client.predict(chunk)
            for ev, s in zip(chunk, scores):
                row = {"score": float(s), "version": version}
                if isinstance(ev, dict) and ev.get("request_id") is not None:
                    row["request_id"] = ev["request_id"]
                print(json.dumps(row))
    except RequestError as e:
        print(f"streamrec predict: bad event: {e}", file=sys.stderr)
        return 2
    except grpc.RpcError as e:
        print(f"streamrec predict: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0
