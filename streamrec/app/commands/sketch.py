"""``streamrec sketch``: run the popularity-sketch worker (faust) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sketch", parents=[common],
        help="count id popularity from the events topic and publish hot sets (faust worker)",
        description="Consume the events topic with a faust worker, keep decayed per-partition popularity "
                    "sketches in a RocksDB-backed faust table (a restarted worker resumes its counts), and "
                    "publish versioned hot sets to the compacted hot-set topic. Without --bootstrap (or "
                    "kafka.bootstrap) an embedded broker is started for this process only, which is useful "
                    "for a demo but nothing else can reach its events.")
    p.add_argument("--faust-log-level", default="warning", help="faust's own log level (default warning)")
    p.set_defaults(func=cmd_sketch)


def cmd_sketch(args) -> int:
    import logging

    from streamrec.app.cli import config_from_args, kafka_bootstrap

    from streamrec.sketch.app import run_worker

    cfg = config_from_args(args)
    with kafka_bootstrap(cfg) as bootstrap:
        logging.getLogger("sketch").info(
            "sketch worker: %s -> %s on %s (group %s, state in %s)", cfg.kafka.events_topic,
            cfg.kafka.hotset_topic, bootstrap, cfg.kafka.sketch_group, cfg.sketch.state_dir)
        return run_worker(cfg, bootstrap, loglevel=args.faust_log_level)
