"""Trainer review: state that did not survive a resume, a metric that read 0 before it had a value, and a
stop during start-up that raised. Each test failed before its fix (see the git log)."""

from __future__ import annotations

import json
import math
import threading

from tests.test_trainer_review import _produce, _stream_cfg
from streamrec.trainer.service import TrainerService


def test_sampled_hot_set_version_continues_after_a_resume(topics, tmp_path, bootstrap):
    """With hot_source 'sample' the version restarted at 1 after a resume: hot_version went backwards
    and the resumed trainer counted and migrated its first hot set again."""
    cfg = _stream_cfg(topics, tmp_path)
    t = cfg.trainer
    t.hot_source, t.hot_sample_events, t.hot_refresh_events = "sample", 512, 0  # decide once
    t.log_path, t.log_every_s = str(tmp_path / "metrics.jsonl"), 0.2
    cfg.hot.budget_rows = 200
    _produce(cfg, bootstrap, 2048)
    first = TrainerService(cfg, bootstrap, progress=False)
    first.run()
    assert first.core.hot_version == 1
    _produce(cfg, bootstrap, 1024)
    t.hot_refresh_events = 512  # the resumed trainer re-counts: its next set must be v2, not v1 again
    second = TrainerService(cfg, bootstrap, progress=False)
    applied = []
    apply = second.core.apply_hot_set
    second.core.apply_hot_set = lambda version, tables: (applied.append(version), apply(version, tables))[1]
    assert second.core.hot_version == 1 and second.core.hot_rows == 200
    second.run()
    assert applied and applied[0] == 2, applied
    versions = [json.loads(x)["hot_version"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert versions == sorted(versions), versions


def test_hit_rate_has_no_value_before_any_lookup(topics, tmp_path, bootstrap):
    """hit_rate read 0.0 (a hot tier that misses everything) before the first lookup; it is NaN: null in
    the metrics log, left unset in Prometheus."""
    cfg = _stream_cfg(topics, tmp_path)
    cfg.trainer.log_path = str(tmp_path / "metrics.jsonl")
    svc = TrainerService(cfg, bootstrap, progress=False)
    try:
        rec = svc.emit()
    finally:
        svc.close()
    assert math.isnan(rec["hit_rate"])
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["hit_rate"] is None


def test_stop_while_waiting_for_partitions_exits_as_stopped(topics, tmp_path, bootstrap):
    """SIGTERM (the stop event) while the group join was still pending raised RuntimeError("no partitions
    ... assigned"): a traceback and exit 1 instead of a clean stop."""
    cfg = _stream_cfg(topics, tmp_path)
    cfg.kafka.consumer_mode = "group"
    stop = threading.Event()
    stop.set()  # the signal arrived before the group assigned anything
    svc = TrainerService(cfg, bootstrap, stop=stop, progress=False)
    summary = svc.run()
    assert summary["reason"] == "stopped" and summary["events"] == 0 and summary["checkpoint"] == 0
