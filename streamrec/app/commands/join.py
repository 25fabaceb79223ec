"""``streamrec join``: run the delayed-feedback joiner (faust) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse


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
    p.set_defaults(func=cmd_join)


def cmd_join(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.app.logs import set_library_level, startup_line
    from streamrec.app.preflight import ensure_port_free, ensure_writable_dir
    from streamrec.foundation import EventSchema
    from streamrec.ingest import TopicSpec, client_settings, ensure_topics

    from streamrec.joiner.app import run_worker

    cfg = config_from_args(args)
    set_library_level(args.faust_log_level)
    ensure_writable_dir(cfg.join.state_dir, "join.state_dir")
    ensure_port_free(cfg.join.metrics_host, cfg.join.metrics_port, "the joiner's metrics endpoint",
                     "join.metrics_port")
    with kafka_bootstrap(cfg) as bootstrap:
        if args.create_topics or not cfg.kafka.bootstrap:
            ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, cfg.kafka.partitions),
                                      TopicSpec(cfg.join.actions_topic, cfg.kafka.partitions)],
                          security=client_settings(cfg.kafka))
        j = cfg.join
        startup_line("join", args, brokers=bootstrap,
                     topics=f"{j.impressions_topic} + {j.actions_topic} -> {cfg.kafka.events_topic}", group=j.group,
                     mode=j.mode, window=f"{j.window_s:g} s + {j.allowed_lateness_s:g} s lateness",
                     data=j.state_dir, batch=j.batch_records,
                     metrics=f"{j.metrics_host}:{j.metrics_port}" if j.metrics_port else None)
        return run_worker(cfg.kafka, cfg.join, EventSchema.from_sections(cfg.model, cfg.ingest), bootstrap,
                          loglevel=args.faust_log_level)
