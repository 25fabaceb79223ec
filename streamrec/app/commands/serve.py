"""``streamrec serve`` (run the gRPC endpoint), ``streamrec predict`` (score JSON events), and the operator's
``streamrec rollback [--to VERSION | --release]`` and ``streamrec accept [--version N]`` (both with
``serving.push_token``, like a push)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="run the gRPC serving endpoint until Ctrl-C/SIGTERM")
    p.add_argument("--port", type=int, default=None, help="override serving.port (0 = a free one, printed)")
    p.add_argument("--device", default=None, help="cpu | cuda[:N] (default: trainer.device, auto)")
    p.add_argument("--snapshot", metavar="DIR", help="load this snapshot directory before serving")
    p.add_argument("--insecure-push", action="store_true",
                   help="start even with an empty serving.push_token on a non-loopback serving.host, i.e. let "
                        "anyone who reaches the port replace the model (warned on every start)")
    p.set_defaults(func=cmd_serve, exit_when_done=True)

    p = sub.add_parser("predict", parents=[common], help="score JSON events (file or stdin) with a running server")
    p.add_argument("input", nargs="?", default="-",
                   help="file of events: a JSON array or one JSON object per line ('-' = stdin)")
    p.add_argument("--target", help="host:port (default: serving.target or serving.host:serving.port)")
    p.add_argument("--token", default=None, help="bearer token (default: serving.predict_token)")
    p.add_argument("--batch", type=int, default=512, help="events per request")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("rollback", parents=[common],
                       help="serve a kept earlier version and pin it (or --release the pin) on a running server")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--to", type=int, default=0, metavar="VERSION",
                   help="the kept version to serve (default: the one promoted before the served one)")
    g.add_argument("--release", action="store_true", help="unpin: serve the newest version the guard passes")
    _operator_args(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("accept", parents=[common],
                       help="promote the version the quality guard holds back (the stream really changed)")
    p.add_argument("--version", type=int, default=0, help="the held version (default: the newest held one)")
    _operator_args(p)
    p.set_defaults(func=cmd_accept)


def _operator_args(p) -> None:
    p.add_argument("--target", help="host:port (default: serving.target or serving.host:serving.port)")
    p.add_argument("--token", default=None, help="bearer token (default: serving.push_token)")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--line", default="", help="the model line (default: main)")


def _operator_call(args, call) -> int:
    """Run ``call(client)`` against the configured server; print its answer as one JSON line."""
    import grpc

    from streamrec.app.cli import config_from_args
    from streamrec.serving import ServingClient, serving_target

    cfg = config_from_args(args)
    token = cfg.serving.push_token if args.token is None else args.token
    client = ServingClient(args.target or serving_target(cfg.serving), token=cfg.serving.predict_token,
                           tls_ca=cfg.serving.tls_ca, timeout=args.timeout, push_token=token)
    try:
        print(json.dumps(call(client)))
    except grpc.RpcError as e:
        print(f"streamrec {args.command}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def cmd_rollback(args) -> int:
    return _operator_call(args, lambda c: c.rollback(to_version=args.to, release=args.release,
                                                         model_line=args.line))


def cmd_accept(args) -> int:
    return _operator_call(args, lambda c: c.accept(version=args.version, model_line=args.line))


def cmd_serve(args) -> int:
    from streamrec.app.cli import config_from_args
    from streamrec.app.wiring import server_settings
    from streamrec.serving import serve

    import logging

    from streamrec.app.logs import IntervalLog, say, startup_line
    from streamrec.app.preflight import ensure_dirs, ensure_port_free

    cfg = config_from_args(args)
    ensure_dirs(cfg, "serving.data_dir")
    ensure_port_free(cfg.serving.host, cfg.serving.port if args.port is None else args.port, "the gRPC endpoint",
                     "serving.port / serve --port")
    ensure_port_free(cfg.serving.metrics_host, cfg.serving.metrics_port, "serving's metrics endpoint",
                     "serving.metrics_port")
    group = cfg.serving.processes > 1
    settings, device = server_settings(cfg), args.device or cfg.trainer.device
    if group:  # serving.processes on one port; each process loads --snapshot itself
        from streamrec.serving import ServingGroup

        server = ServingGroup(settings, device=device, port=args.port, insecure_push=args.insecure_push,
                              snapshot=args.snapshot).start()
    else:
        server = serve(settings, device=device, port=args.port, insecure_push=args.insecure_push)
    startup_line("serve", args, ports=f"gRPC {server.target} ({'TLS' if server.tls else 'plaintext'})"
                 + (f", {cfg.serving.processes} processes" if group else ""),
                 device=str(getattr(server, "device", device)), data=cfg.serving.data_dir,
                 push_token="set" if cfg.serving.push_token else "none", brokers="none (snapshots arrive over gRPC)")
    for w in server.warnings:  # also logged; printed so that no log setting hides them
        say(f"streamrec serve: WARNING: {w}")
    if args.snapshot and not group and (why := server.service.install_from(args.snapshot)) is not None:
        print(f"--snapshot not loaded: {why}", file=sys.stderr)
    print(server.target, flush=True)
    say(f"serving on {server.target}; Ctrl-C stops it")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    progress = IntervalLog(logging.getLogger("streamrec.serve"), 30.0) if not sys.stderr.isatty() else None
    try:
        while not stop.wait(0.5):
            if group and progress is not None and progress.due():
                progress.maybe("serving group: %d of %d processes alive, %d restarts so far", len(server.processes),
                               cfg.serving.processes, server.restarts)
            elif progress is not None and progress.due():  # without a TTY: a sign of life in the log
                cur = server.service.current
                progress.maybe("serving version %s: %s Predict requests, %s events so far",
                               cur.version if cur is not None else "none yet",
                               f"{server.service.requests_served:,}", f"{server.service.events_served:,}")
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

    from streamrec.serving import RequestError, ServingClient, serving_target

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
    client = ServingClient(args.target or serving_target(cfg.serving), token=token, tls_ca=cfg.serving.tls_ca,
                           timeout=args.timeout, max_message_mb=cfg.serving.max_message_mb)
    try:
        for i in range(0, len(events), args.batch):
            chunk = events[i:i + args.batch]
            tasks, version = client.predict_tasks(chunk)
            if not tasks:  # a server without per-task scores
                scores, version = client.predict(chunk)
                tasks = {"score": scores}
            names = list(tasks)
            for i, ev in enumerate(chunk):
                row = {"score": float(tasks[names[0]][i]), "version": version}
                if len(names) > 1:  # several tasks: each one's score; score is the first task's
                    row = {"score": row["score"], "scores": {t: float(tasks[t][i]) for t in names}, "version": version}
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
