"""``streamrec train``: the continuous trainer against the embedded broker or ``--bootstrap``.

One process by default. ``--nproc N`` starts a group of N ranks that train one
model (``torch.distributed.run``: c10d rendezvous on loopback, the group restarted
from its last checkpoint when a rank dies, up to ``trainer.max_restarts`` times).
Across hosts, torchrun starts the same command on each host, which then runs as
one rank of the group (it sees torchrun's ``RANK``/``WORLD_SIZE``)::

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST0:29400 \\
        -m streamrec train --config model.toml --bootstrap kafka:9092

SIGINT/SIGTERM make it (every rank) finish the window in hand, write a final
checkpoint, commit its offsets and exit 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import sys
import threading

from streamrec.app.wiring import trainer_settings
from streamrec.app.config import Config
from streamrec.foundation.config import ConfigError

log = logging.getLogger("streamrec.train")


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("train", parents=[common],
                       help="train continuously from the events topic (checkpoints, snapshots, metrics)")
    p.add_argument("--max-events", type=int, help="stop after this many events (trainer.max_events)")
    p.add_argument("--idle-exit", type=float, metavar="S",
                   help="stop after S seconds without events while no fetch shows records left (trainer.idle_exit_s)")
    p.add_argument("--until-end", action="store_true",
                   help="stop at the end of the stream as it is at start: a finite replay (trainer.until_end)")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="train with a group of N ranks on this host (trainer.ranks; default 1: one process)")
    p.add_argument("--max-restarts", type=int, metavar="K",
                   help="restart the group from its last checkpoint up to K times when a rank dies "
                        "(trainer.max_restarts)")
    p.set_defaults(func=cmd_train)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def cmd_train(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.trainer.group import is_group_checkpoint

    flags = {"max_events": args.max_events, "idle_exit_s": args.idle_exit, "until_end": args.until_end or None,
             "ranks": args.nproc, "max_restarts": args.max_restarts}
    try:  # the flags are checked as the keys they set are: one line naming the key
        cfg = config_from_args(args).with_values(trainer={k: v for k, v in flags.items() if v is not None})
    except ConfigError as e:
        print(f"streamrec train: {e}", file=sys.stderr)
        return 2
    if cfg.trainer.until_end and (cfg.trainer.ranks > 1 or _under_torchrun()):
        print("streamrec train: --until-end (trainer.until_end) is not supported by a trainer group yet: use "
              "--max-events or --idle-exit", file=sys.stderr)
        return 2
    cfg = _only_configured_pushes(cfg)
    if cfg.trainer.ranks > 1 and not _under_torchrun():
        return _launch_group(cfg, args)  # torch.distributed.run handles the signals and passes them on
    stop = _stop_on_signals()
    if _under_torchrun():
        return _run_rank(cfg, args, stop)
    _preflight(cfg)
    with kafka_bootstrap(cfg) as bootstrap:
        _startup(cfg, args, bootstrap)
        if is_group_checkpoint(cfg.trainer.checkpoint_dir):  # a group's checkpoint, resumed by one process
            return _finish(_group_of_one(cfg, bootstrap, stop, args))
        from streamrec.foundation import resource_step
        from streamrec.serving import SnapshotPusher
        from streamrec.trainer import TrainerService

        # a resource error whose writer named neither itself nor its file still names the data directory
        with resource_step("a write of the trainer", os.path.dirname(os.path.abspath(cfg.trainer.checkpoint_dir))):
            svc = TrainerService(trainer_settings(cfg), bootstrap, stop=stop, progress=False if args.no_progress else None,
                                 pusher_factory=SnapshotPusher.factory(cfg.serving))
            return _finish(svc.run())


def _only_configured_pushes(cfg: Config) -> Config:
    """Push snapshots only to a target someone configured: the default serving address is where a client
    looks, not proof that a server runs there (retrying it cost warnings and a slower exit)."""
    if cfg.trainer.push_snapshots and not (cfg.serving.target or cfg.serving.push_targets):
        log.info("no serving.target or serving.push_targets set: snapshots are built in %s, not pushed",
                 cfg.trainer.snapshot_dir)
        return cfg.with_values(trainer={"push_snapshots": False})
    return cfg


def _preflight(cfg) -> None:
    from streamrec.app.preflight import ensure_dirs, ensure_port_free

    ensure_dirs(cfg, "store.path", "trainer.checkpoint_dir", "trainer.snapshot_dir", "trainer.log_path")
    ensure_port_free(cfg.trainer.metrics_host, cfg.trainer.metrics_port, "the trainer's metrics endpoint",
                     "trainer.metrics_port")


def _startup(cfg, args, bootstrap: str) -> None:
    from streamrec.app.logs import startup_line
    from streamrec.foundation import resolve_device
    from streamrec.serving import push_targets

    t = cfg.trainer
    stop_at = [f"{t.max_events:,} events" if t.max_events else "", f"{t.idle_exit_s:g} s idle" if t.idle_exit_s else "",
               "end of stream" if t.until_end else ""]
    startup_line("train", args, brokers=bootstrap, topics=f"{cfg.kafka.events_topic} (group {cfg.kafka.trainer_group}), "
                 f"{cfg.kafka.hotset_topic}", ports=f"metrics {t.metrics_host}:{t.metrics_port}" if t.metrics_port else "",
                 device=str(resolve_device(t.device)), data=os.path.dirname(os.path.abspath(t.checkpoint_dir)),
                 push=", ".join(push_targets(cfg.serving)) if t.push_snapshots else "off (snapshots only built)",
                 metrics_log=t.log_path, stop=" or ".join(x for x in stop_at if x) or "on SIGTERM")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum, _frame):
        if stop.is_set():  # second signal: give up on the clean drain
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _finish(summary: dict) -> int:
    print(json.dumps({k: (v if v == v else None) for k, v in summary.items()}), flush=True)
    from streamrec.app.logs import say

    say(f"trainer stopped ({summary['reason']}): {summary['events']:,} events, checkpoint {summary['checkpoint']}")
    return 0


def _group_of_one(cfg, bootstrap: str, stop, args) -> dict:
    """Resume a group's checkpoint with one rank (its rows are resharded into one store)."""
    import torch.distributed as dist

    from streamrec.serving import SnapshotPusher
    from streamrec.trainer.group import GroupTrainerService

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        svc = GroupTrainerService(trainer_settings(cfg), bootstrap, 0, 1, stop=stop, progress=False if args.no_progress else None,
                                  pusher_factory=SnapshotPusher.factory(cfg.serving))
        return svc.run()
    finally:
        dist.destroy_process_group()


def _run_rank(cfg, args, stop) -> int:
    """This process is one rank of a group that torchrun started."""
    import torch
    import torch.distributed as dist

    from streamrec.foundation import die_with_parent, resolve_device
    from streamrec.serving import SnapshotPusher
    from streamrec.trainer.group import GroupTrainerService

    die_with_parent()  # torchrun's agent, or the fork server of a local group (whose ranks watch the agent too)
    if not cfg.kafka.bootstrap:
        print("streamrec train: a rank of a trainer group needs --bootstrap (or kafka.bootstrap): every rank must "
              "read the same cluster", file=sys.stderr)
        return 2
    device = resolve_device(cfg.trainer.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":  # NCCL when every rank has a GPU; one GPU per local rank
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        cfg = cfg.with_values(trainer={"device": f"cuda:{local_rank % torch.cuda.device_count()}"})
    backend = "nccl" if device.type == "cuda" else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    timeout = datetime.timedelta(seconds=cfg.trainer.group_timeout_s)  # a silent (cut off) rank fails the step then
    # the rendezvous store outlives a restart: keys of the attempt that died (its ranks' gloo addresses) would
    # be read by the next one and its connections refused, so each attempt gets its own key prefix
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timeout, multi_tenant=True)
    dist.init_process_group(backend, store=dist.PrefixStore(f"streamrec/attempt-{restart}", store), rank=rank,
                            world_size=world, timeout=timeout)
    if restart and rank == 0:
        log.warning("trainer group restarted (%d so far): a rank died (torchrun's log above names it); resuming from "
                    "the last complete checkpoint", restart)
    try:
        svc = GroupTrainerService(trainer_settings(cfg), cfg.kafka.bootstrap, rank, world, stop=stop,
                                  progress=False if args.no_progress or rank else None,
                                  pusher_factory=SnapshotPusher.factory(cfg.serving) if rank == 0 else None)
        summary = svc.run()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        return _finish(summary)
    return 0


def _launch_group(cfg, args) -> int:
    """Start ``trainer.ranks`` local ranks with torch.distributed.run (elastic: restarts on a rank's death)."""
    import multiprocessing
    import tempfile
    from contextlib import ExitStack

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    from streamrec.app.cli import kafka_bootstrap
    from streamrec.app.rank_entry import preload_modules, rank_main, release_ranks_on_close
    from streamrec.ingest import client_settings, free_port
    from streamrec.trainer.group import GroupError, check_partitions

    n = cfg.trainer.ranks
    _preflight(cfg)
    with ExitStack() as stack:
        bootstrap = stack.enter_context(kafka_bootstrap(cfg))  # creates the events topic with >= n partitions
        _startup(cfg, args, bootstrap)
        try:  # refused here, once: in the ranks it would be retried at every restart
            check_partitions(bootstrap, cfg.kafka.events_topic, n, security=client_settings(cfg.kafka))
        except GroupError as e:
            print(f"streamrec train: {e}", file=sys.stderr)
            return 2
        rank_args = ["train", "--bootstrap", bootstrap, "--log-level", args.log_level, "--log-format", args.log_format]
        if args.data_dir:
            rank_args += ["--data-dir", args.data_dir]
        if args.config:
            rank_args += ["--config", args.config]
        for o in args.overrides or []:
            rank_args += ["--set", o]
        if cfg.trainer.max_events:
            rank_args += ["--max-events", str(cfg.trainer.max_events)]
        if cfg.trainer.idle_exit_s:
            rank_args += ["--idle-exit", str(cfg.trainer.idle_exit_s)]
        if args.no_progress:
            rank_args.append("--no-progress")
        # torch's per-launch log folder (the ranks' error files) goes with the launch, not left in /tmp
        log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="streamrec-train-ranks-"))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: the group talks over loopback only
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
        launch = get_args_parser().parse_args([
            "--nnodes", "1", "--nproc-per-node", str(n), "--max-restarts", str(cfg.trainer.max_restarts),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--monitor-interval", "1",
            "--start-method", "forkserver", "--log-dir", log_dir, "--module", "streamrec", *rank_args])
        launch_config, _command, _ = config_from_args(launch)  # torchrun's --module: rank_main replaces it
        # the ranks fork from one server that imported what a rank needs (streamrec/app/rank_entry.py)
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            preload_modules(cfg.trainer.snapshot_every > 0))
        release_ranks_on_close()
        print(f"streamrec train: starting {n} ranks (torch.distributed.run, up to {cfg.trainer.max_restarts} "
              f"restarts) against {bootstrap}", file=sys.stderr)
        try:
            elastic_launch(config=launch_config, entrypoint=rank_main)(str(os.getpid()), *rank_args)
        except ChildFailedError as e:
            print(f"streamrec train: the trainer group failed after its restarts:\n{e.format_msg()}", file=sys.stderr)
            return 1
        except SignalException as e:  # torchrun passed the signal on and waited for the ranks' final checkpoint
            print(f"streamrec train: stopped by signal {e.sigval}; the ranks wrote their final checkpoint",
                  file=sys.stderr)
            return 0
    return 0
