"""``streamrec join``: run the delayed-feedback joiner (faust) until SIGINT/SIGTERM; with ``--workers N``,
N worker processes of one group on this machine, supervised by this one."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

log = logging.getLogger("streamrec.join")


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "join", parents=[common],
        help="join impressions with their later actions into labelled events (faust worker)",
        description="Read join.impressions_topic and join.actions_topic (co-partitioned, keyed by request_id), "
                    "join each impression with the actions that follow it in event time (join.mode: window or "
                    "fake_negative), and write labelled events to kafka.events_topic; malformed records go to "
                    "kafka.dlq_topic. State lives in RocksDB-backed faust tables under join.state_dir. See "
                    "docs/joining.md.")
    p.add_argument("--create-topics", action="store_true",
                   help="create the two input topics (kafka.partitions each) when they are missing")
    p.add_argument("--faust-log-level", default="warning",
                   help="log level of faust, mode and aiokafka, whatever --log-level is (default warning)")
    p.add_argument("--workers", type=_positive, default=1, metavar="N",
                   help="worker processes on this machine, one join.group splitting the partitions (default 1: "
                        "this process is the worker); worker i keeps its state in join.state_dir/worker-<i>, its "
                        "log in join.state_dir/worker-<i>.log and serves metrics on join.metrics_port + i")
    p.add_argument("--stop-grace-s", type=float, default=30.0, metavar="S",
                   help="with --workers N > 1: seconds the workers get to stop after SIGTERM/SIGINT before "
                        "SIGKILL (default 30)")
    p.set_defaults(func=cmd_join)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n


def cmd_join(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.app.logs import set_library_level, startup_line
    from streamrec.app.preflight import ensure_port_free, ensure_writable_dir
    from streamrec.foundation import EventSchema
    from streamrec.ingest import TopicSpec, client_settings, ensure_topics

    from streamrec.joiner.app import run_worker

    cfg = config_from_args(args)
    workers = getattr(args, "workers", 1)
    set_library_level(args.faust_log_level)
    ensure_writable_dir(cfg.join.state_dir, "join.state_dir")
    for i in range(workers if cfg.join.metrics_port else 0):
        ensure_port_free(cfg.join.metrics_host, cfg.join.metrics_port + i, "the joiner's metrics endpoint",
                         "join.metrics_port")
    with kafka_bootstrap(cfg) as bootstrap:
        if args.create_topics or not cfg.kafka.bootstrap:
            ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, cfg.kafka.partitions),
                                      TopicSpec(cfg.join.actions_topic, cfg.kafka.partitions)],
                          security=client_settings(cfg.kafka))
        j = cfg.join
        startup_line("join", args, brokers=bootstrap,
                     topics=f"{j.impressions_topic} + {j.actions_topic} -> {cfg.kafka.events_topic}", group=j.group,
                     mode=j.mode, window=f"{j.longest_window_s:g} s + {j.allowed_lateness_s:g} s lateness",
                     data=j.state_dir, batch=j.batch_records, workers=workers if workers > 1 else None,
                     metrics=f"{j.metrics_host}:{j.metrics_port}" if j.metrics_port else None)
        if workers > 1:
            return run_workers(args, bootstrap, Path(j.state_dir).resolve(), j.metrics_port, workers)
        return run_worker(cfg.kafka, cfg.join, EventSchema.from_sections(cfg.model, cfg.ingest), bootstrap,
                          loglevel=args.faust_log_level)


def worker_argv(args, bootstrap: str, state_dir: Path, metrics_port: int, i: int) -> list[str]:
    """The command line of worker ``i``: this command's config, overrides and logging, the resolved
    ``bootstrap`` (an embedded broker is this process's), its own ``join.state_dir`` and metrics port."""
    argv = [sys.executable, "-m", "streamrec", "join", "--bootstrap", bootstrap,
            "--log-level", str(args.log_level), "--log-format", str(args.log_format),
            "--faust-log-level", str(args.faust_log_level)]
    if args.config:
        argv += ["--config", os.path.abspath(args.config)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    for pair in args.overrides or []:
        argv += ["--set", pair]
    argv += ["--set", f"join.state_dir={state_dir / f'worker-{i}'}"]
    if metrics_port:
        argv += ["--set", f"join.metrics_port={metrics_port + i}"]
    return argv


def run_workers(args, bootstrap: str, state_dir: Path, metrics_port: int, workers: int) -> int:
    """Start ``workers`` joiner processes of one group and supervise them: SIGINT/SIGTERM is forwarded to
    all (SIGKILL after ``--stop-grace-s``: a faust worker may ignore it) and ends this process with 0; a
    worker that exits stops the others and ends this process with 1, naming it and its exit code."""
    from streamrec.app.procs import Supervisor, watch_children

    sup = Supervisor(state_dir)
    try:
        for i in range(workers):
            child = sup.start(f"worker-{i}", worker_argv(args, bootstrap, state_dir, metrics_port, i))
            log.info("join worker %d: pid %d, log %s", i, child.pid, child.log_path)
        dead, signum = watch_children(sup)
    except BaseException:
        sup.stop_together(args.stop_grace_s)
        raise
    killed = sup.stop_together(args.stop_grace_s, signum or signal.SIGTERM)
    for c in killed:
        log.warning("join %s (pid %d) did not stop within %g s: killed", c.name, c.pid, args.stop_grace_s)
    if dead is None:
        log.info("join: signal %d forwarded, %d workers stopped", signum, workers)
        return 0
    print(f"join: {dead.name} (pid {dead.pid}) exited with code {dead.poll()}; the other workers were stopped. "
          f"Last lines of its log ({dead.log_path}):\n{dead.tail()}", file=sys.stderr, flush=True)
    return 1
