"""`streamrec train --until-end` on a finite replay: it stops by itself at the end of the stream as it was
at start (bad records at the tail included), after a final checkpoint; it says at start what it is
connected to; with no serving target configured it builds snapshots without trying to push them; and its
metrics log carries freshness by both clocks (the Kafka record timestamp and the event's own ts)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from tests.helpers.trainer import produce, read_jsonl, trainer_cfg

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

EVENTS = 6_000


def test_until_end_stops_at_the_end_and_pushes_nowhere_unconfigured(topics, tmp_path, bootstrap):
    cfg = trainer_cfg(topics, tmp_path)
    cfg.trainer.idle_exit_s = 0.0  # only --until-end can stop it
    cfg.trainer.push_snapshots = True  # on, but no serving.target / push_targets: nothing to push to
    cfg.serving.target, cfg.serving.push_targets = "", ""
    cfg.generator.start_ts_ms = 1_500_000_000_000  # old event times: the event clock reads years
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    produce(cfg, bootstrap, EVENTS, bad=3)
    produced_ms = time.time() * 1000
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--until-end", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["reason"] == "end of stream" and summary["events"] == EVENTS
    assert summary["dead_letters"] == 3
    assert "train starting:" in r.stderr and f"brokers {bootstrap}" in r.stderr and "push off" in r.stderr
    assert "not pushed" in r.stderr
    assert "push failed" not in r.stderr and "retrying" not in r.stderr
    assert list((tmp_path / "snapshots").iterdir()), "snapshots are still built"
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    now_ms = time.time() * 1000
    assert 0 <= last["freshness_kafka_s"] <= (now_ms - produced_ms) / 1000 + 120  # minutes, by the Kafka clock
    assert last["freshness_event_s"] > 365 * 86_400  # years, by the events' own (replayed) time
    assert math.isfinite(last["freshness_kafka_s"])
