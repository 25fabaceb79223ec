"""Impressions and the actions that follow them, with delayed, heavy-tailed feedback and drift.

Each impression shows one item to one user (Zipf-popular ids for every model field, ``model.dense_dim``
Gaussian features). Whether it is clicked is drawn from a hidden logistic model whose item preferences
drift with event time (a slow rotation of every item's latent vector), so a model that waits for labels
learns an older world. A click arrives after a lognormal delay (heavy-tailed: most within minutes, some
after the attribution window); a clicked impression converts with a fixed probability, later still.
:meth:`DelayedStream.generate` returns the impressions, the actions in arrival (event-time) order, and the
true label of every impression (clicked at all, whatever the delay): quality is judged against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from streamrec.foundation.model_config import ModelConfig
from streamrec.ingest.ingest_config import GeneratorConfig


class DelayedStream:
    """Impressions of ``model``'s fields and dense width at ``generator``'s rate, start time, click rate and
    per-field id cardinality and skew."""

    def __init__(self, model: ModelConfig, generator: GeneratorConfig, seed: int = 7, delay_median_s: float = 120.0,
                 delay_sigma: float = 1.5,
                 conversion_rate: float = 0.1, drift_per_hour: float = 0.5):
        self.fields = list(model.field_names)
        self.dense_dim = int(model.dense_dim)
        self.start = int(generator.start_ts_ms)
        self.step_ms = 1000.0 / float(generator.events_per_s)
        self.base_rate = float(generator.base_rate)
        self.cards = {f: generator.field(f).cardinality for f in self.fields}
        self.zipf = {f: generator.field(f).zipf for f in self.fields}
        self.seed = seed
        self.mu = float(np.log(delay_median_s))
        self.sigma = delay_sigma
        self.conversion_rate = conversion_rate
        self.drift = drift_per_hour

    def _ids(self, rng, f: str, n: int) -> np.ndarray:
        card = self.cards[f]
        w = 1.0 / np.arange(1, min(card, 100_000) + 1) ** self.zipf[f]
        return rng.choice(len(w), size=n, p=w / w.sum())

    def generate(self, n: int) -> tuple[list[dict], list[dict], dict[str, int]]:
        rng = np.random.default_rng(self.seed)
        ts = self.start + (np.arange(n) * self.step_ms).astype(np.int64)
        ids = {f: self._ids(rng, f, n) for f in self.fields}
        dense = rng.normal(size=(n, self.dense_dim)).astype(np.float32)
        k = 4
        user_vec = np.random.default_rng(self.seed + 1).normal(size=(100_000, k))
        item_vec = np.random.default_rng(self.seed + 2).normal(size=(100_000, k))
        hours = (ts - self.start) / 3_600_000.0
        ang = self.drift * hours  # the drift: every item's latent vector turns with event time
        u = user_vec[ids[self.fields[0]]]
        it = item_vec[ids[self.fields[-1]] if len(self.fields) > 1 else ids[self.fields[0]]]
        rot0 = it[:, 0] * np.cos(ang) - it[:, 1] * np.sin(ang)
        rot1 = it[:, 0] * np.sin(ang) + it[:, 1] * np.cos(ang)
        it = np.column_stack([rot0, rot1, it[:, 2:]])
        logit = np.log(self.base_rate / (1 - self.base_rate)) + (u * it).sum(1) / np.sqrt(k) + dense[:, :1].sum(1) * 0.3
        clicked = rng.random(n) < 1 / (1 + np.exp(-logit))
        delay = rng.lognormal(self.mu, self.sigma, size=n) * 1000.0
        converted = clicked & (rng.random(n) < self.conversion_rate)
        conv_delay = delay + rng.lognormal(self.mu + 2.0, self.sigma, size=n) * 1000.0
        imps, acts, truth = [], [], {}
        for i in range(n):
            rid = f"r{self.seed}-{i}"
            imps.append({"ts": int(ts[i]), "dense": [float(x) for x in dense[i]],
                         "sparse": {f: int(ids[f][i]) for f in self.fields}, "request_id": rid})
            truth[rid] = int(clicked[i])
            if clicked[i]:
                acts.append({"request_id": rid, "ts": int(ts[i] + delay[i]), "type": "click"})
            if converted[i]:
                acts.append({"request_id": rid, "ts": int(ts[i] + conv_delay[i]), "type": "conversion"})
        acts.sort(key=lambda a: (a["ts"], a["request_id"]))
        return imps, acts, truth

    def write(self, n: int, out_dir: str | Path) -> dict[str, Path]:
        """Write ``impressions.jsonl``, ``actions.jsonl`` and ``truth.jsonl`` (request_id, label) into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        imps, acts, truth = self.generate(n)
        paths = {name: out / f"{name}.jsonl" for name in ("impressions", "actions", "truth")}
        for name, rows in (("impressions", imps), ("actions", acts),
                           ("truth", [{"request_id": r, "label": y} for r, y in truth.items()])):
            with open(paths[name], "w") as f:
                f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        return paths
