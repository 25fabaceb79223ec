"""The served model, judged from outside: held-out events scored through gRPC Predict.

Progressive validation (the trainer's AUC) says how well the model predicted each
event before training on it; this says what a client gets: the AUC of the served
version on events it never saw, next to the Bayes-optimal AUC of the same events
when they are generated (the ceiling: the generator's own click probabilities),
and Predict's latency as a client measures it. ``evaluation.json`` in the run
directory holds the result for ``streamrec report``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.foundation import EventBatch, roc_auc

EVAL_FILE = "evaluation.json"


def _auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    y = labels >= 0.5
    if len(y) < 2 or y.all() or not y.any():  # AUC needs both classes
        return None
    v = float(roc_auc(y.astype(np.float32), scores))
    return v if math.isfinite(v) else None


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ms = np.asarray(seconds) * 1000.0
    return {f"p{q}": round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)} | {"max": round(float(ms.max()), 3)}


def evaluate(client, batch: EventBatch, truth: np.ndarray | None = None, request_events: int = 256,
             latency_calls: int = 200, held_out: bool = True) -> dict[str, Any]:
    """Score ``batch`` through ``client`` (labels withheld); AUC against its labels; Bayes AUC from ``truth``
    (the generator's probabilities) when given; latency of ``latency_calls`` one-event Predict calls."""
    events = batch.to_events()
    for ev in events:
        ev.pop("label", None)
    scores: list[float] = []
    version = 0
    for i in range(0, len(events), request_events):
        s, version = client.predict(events[i:i + request_events])
        scores.extend(float(x) for x in s)
    times = []
    for i in range(min(latency_calls, len(events))):
        t0 = time.perf_counter()
        client.predict([events[i]])
        times.append(time.perf_counter() - t0)
    out: dict[str, Any] = {
        "events": len(events), "held_out": held_out, "served_version": int(version),
        "served_auc": _auc(batch.labels, np.asarray(scores)),
        "bayes_auc": _auc(batch.labels, truth) if truth is not None and len(truth) == len(events) else None,
        "predict_latency_ms": percentiles_ms(times), "latency_calls": len(times),
    }
    return out


def write_evaluation(run_dir: Path, result: dict[str, Any]) -> Path:
    p = Path(run_dir) / EVAL_FILE
    p.write_text(json.dumps(result, indent=1))
    return p


def read_evaluation(run_dir: Path) -> dict[str, Any]:
    try:
        d = json.loads((Path(run_dir) / EVAL_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}
