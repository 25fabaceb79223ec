"""Shared helpers for the trainer tests against the broker: configs, producing synthetic events,
reading the trainer's JSON-lines logs."""

from __future__ import annotations

import json
from pathlib import Path

from streamrec.ingest import EventProducer, EventSchema, SyntheticStream

PER_MESSAGE = 256  # events per Kafka message
CKPT_EVERY = 8_192  # events between checkpoints (trainer_cfg)
BS = 256  # batch size


def stream_cfg(cfg, tmp_path):
    """A short-running trainer: no hot source, no snapshots, only the final checkpoint, idle exit after 1.5 s."""
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 256, 4, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 10**9, 600.0  # only the final checkpoint
    t.hot_source, t.snapshot_every, t.idle_exit_s, t.log_every_s = "none", 0, 1.5, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 256
    return cfg


def trainer_cfg(cfg, tmp_path):
    """A trainer with everything on: checkpoints every CKPT_EVERY events, a sampled hot set, a snapshot
    per checkpoint (not pushed), metrics and trace logs in ``tmp_path``, idle exit after 4 s."""
    t = cfg.trainer
    t.batch_size, t.window_batches = BS, 4
    t.checkpoint_every_events, t.checkpoint_every_s = CKPT_EVERY, 120.0
    t.hot_source, t.hot_sample_events = "sample", 4096
    cfg.hot.budget_rows = 1000
    t.snapshot_every, t.push_snapshots, t.snapshot_dir = 1, False, str(tmp_path / "snapshots")
    t.log_path, t.trace_path = str(tmp_path / "metrics.jsonl"), str(tmp_path / "trace.jsonl")
    t.idle_exit_s, t.log_every_s, t.device = 4.0, 0.5, "cpu"
    cfg.kafka.consumer_mode = "assign"
    cfg.kafka.events_per_message = PER_MESSAGE
    return cfg


def produce(cfg, bootstrap, n, bad=0):
    """``n`` synthetic events into the events topic, then ``bad`` records that do not decode."""
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(n):
        prod.send_batch(b)
    for _ in range(bad):
        prod.send_raw(b"\x00not an event")
    prod.close()


def read_jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
