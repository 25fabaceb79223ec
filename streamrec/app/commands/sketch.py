"""``streamrec sketch``: run the popularity-sketch worker (faust) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamrec.sketch import CountingSpec


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sketch", parents=[common],
        help="count id popularity from the events topic and publish hot sets (faust worker)",
        description="Consume the events topic with a faust worker, keep decayed per-partition popularity "
                    "sketches in a RocksDB-backed faust table (a restarted worker resumes its counts), and "
                    "publish versioned hot sets to the compacted hot-set topic. Without --bootstrap (or "
                    "kafka.bootstrap) an embedded broker is started for this process only, which is useful "
                    "for a demo but nothing else can reach its events.")
    p.add_argument("--faust-log-level", default="warning",
                   help="log level of faust, mode and aiokafka, whatever --log-level is (default warning)")
    p.set_defaults(func=cmd_sketch)


def counting_spec(cfg) -> "CountingSpec":
    """What the sketch worker counts and chooses its hot set within, computed once from the whole config."""
    from streamrec.foundation import EventSchema, hot_budget
    from streamrec.sketch import CountingSpec

    return CountingSpec(cfg.sketch, EventSchema.from_sections(cfg.model, cfg.ingest), hot_budget(cfg.hot, cfg.model), dict(cfg.model.field_tables),
                        cfg.kafka.events_topic)


def cmd_sketch(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.app.logs import set_library_level, startup_line
    from streamrec.app.preflight import ensure_dirs, ensure_port_free

    from streamrec.sketch.app import run_worker

    cfg = config_from_args(args)
    set_library_level(args.faust_log_level)
    ensure_dirs(cfg, "sketch.state_dir")  # faust and the in-flight marker expect it to exist
    ensure_port_free(cfg.sketch.metrics_host, cfg.sketch.metrics_port, "the sketch worker's metrics endpoint",
                     "sketch.metrics_port")
    with kafka_bootstrap(cfg) as bootstrap:
        startup_line("sketch", args, brokers=bootstrap,
                     topics=f"{cfg.kafka.events_topic} -> {cfg.kafka.hotset_topic}", group=cfg.kafka.sketch_group,
                     device="cpu", data=cfg.sketch.state_dir,
                     publish=f"every {cfg.sketch.publish_interval_s:g} s when the hot set changed")
        return run_worker(cfg.kafka, counting_spec(cfg), bootstrap, loglevel=args.faust_log_level)
