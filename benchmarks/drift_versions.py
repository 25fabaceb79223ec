"""``streamrec bench quality --drift``: how far a clean stream's successive versions' scores move, the figure
serving's live drift watch judges (``serving/drift.py``: mean |log-odds difference| of two versions' scores
on the same events), against versions trained through an incident.

A trainer learns the stream in time order and keeps a version every ``every`` events; every version scores
the same held-out events that follow the training stretch (the live requests a server would pair). Clean:
the figure between versions ``lag`` apart, for several lags (a candidate waits several versions after a
hold). Incidents, each from the last clean version before it: labels flipped, and one field (``item``, or the
second field) taken from the event 1,000 later (a misaligned join), for ``incident`` events from the middle
of the stream. ``serving.guard.drift_max`` must sit well above the clean figures.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

LAGS = (1, 3, 8, 16, 24)
MISALIGN = 1000  # the misaligned join takes the field from the event this many rows later


def _versions(cfg, events, probe, every: int, path: Path, broken=None) -> list[np.ndarray]:
    """First-task scores on ``probe`` of each version (one every ``every`` events); ``broken(start, batch)``
    changes a training batch (an incident) or returns it."""
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.trainer import TrainerCore

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(path))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    out = []
    try:
        for s in range(0, len(events), every):
            b = events.take(np.arange(s, min(len(events), s + every)))
            core.feed(broken(s, b) if broken else b, flush=True)
            out.append(core.predict(probe)[:, 0].astype(np.float64))
    finally:
        store.close()
    return out


def _drift(a: np.ndarray, b: np.ndarray) -> float:
    from streamrec.serving.drift import log_odds

    return float(np.mean(np.abs(log_odds(a) - log_odds(b))))


def run(stream: str, cfg, events, every: int, probe_n: int, seed: int) -> dict:
    """The figures of one stream: clean lags' median and max, and each incident's largest drift from the
    last clean version."""
    n = len(events) - probe_n - MISALIGN
    train, probe = events.take(np.arange(n)), events.take(np.arange(n, n + probe_n))
    start = (n // 2) // every * every
    stretch = (start, start + n // 3)
    field = "item" if "item" in cfg.model.field_names else cfg.model.field_names[min(1, len(cfg.model.fields) - 1)]

    def flip(s, b):
        if stretch[0] <= s < stretch[1]:
            b.labels[:] = 1 - b.labels
        return b

    def misalign(s, b):
        if stretch[0] <= s < stretch[1]:
            b.sparse[field] = events.take(np.arange(s + MISALIGN, s + MISALIGN + len(b))).sparse[field]
        return b

    out: dict = {"stream": stream, "events": n, "every": every, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="bench-drift-") as tmp:
        clean = _versions(cfg, train, probe, every, Path(tmp) / "clean")
        first = min(3, len(clean) - 2)  # the first versions move most: a server's first is promoted unjudged
        for lag in LAGS:
            d = [_drift(clean[k + lag], clean[k]) for k in range(first, len(clean) - lag)]
            if d:
                out[f"clean_lag{lag}_median"], out[f"clean_lag{lag}_max"] = float(np.median(d)), float(np.max(d))
        out["clean_max"] = max(v for k, v in out.items() if k.startswith("clean_lag") and k.endswith("_max"))
        base = start // every - 1  # the last clean version before the stretch
        for name, broken in (("flip", flip), ("misaligned_join", misalign)):
            vs = _versions(cfg, train, probe, every, Path(tmp) / name, broken)
            inside = [_drift(v, clean[base]) for v in vs[base + 1:(stretch[1] + every - 1) // every]]
            out[f"{name}_max"] = float(max(inside)) if inside else 0.0
    return out
