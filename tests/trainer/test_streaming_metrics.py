"""The trainer's streaming metrics: progressive and windowed AUC and log loss agree with exact
computations, and a metric without a value yet (hit rate before any lookup) says so."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.foundation import roc_auc
from streamrec.trainer.metrics import StreamingMetrics
from streamrec.trainer.service import TrainerService
from tests.helpers.trainer import stream_cfg


def test_streaming_metrics_match_exact_auc():
    rng = np.random.default_rng(0)
    y = (rng.random(30_000) < 0.3).astype(np.float32)
    p = np.clip(0.3 + 0.2 * (y - 0.3) + rng.normal(0, 0.2, len(y)), 0.001, 0.999).astype(np.float32)
    m = StreamingMetrics(window=5000)
    for s in range(0, len(y), 777):
        m.update(y[s:s + 777], p[s:s + 777])
    assert abs(m.auc - roc_auc(y, p)) < 1e-3
    assert m.window_auc() == pytest.approx(roc_auc(y[-5000:], p[-5000:]), abs=1e-9)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert m.logloss == pytest.approx(ll, rel=1e-6)


def test_hit_rate_has_no_value_before_any_lookup(topics, tmp_path, bootstrap):
    """Before the first lookup hit_rate is NaN (null in the metrics log, left unset in Prometheus), not
    0.0, which would read as a hot tier that misses everything."""
    cfg = stream_cfg(topics, tmp_path)
    cfg.trainer.log_path = str(tmp_path / "metrics.jsonl")
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    try:
        rec = svc.emit()
    finally:
        svc.close()
    assert math.isnan(rec["hit_rate"])
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["hit_rate"] is None
