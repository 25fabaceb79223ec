"""A deterministic synthetic event stream with a known ground truth.

Ids per field are Zipf-distributed over up to 10^8 distinct values (sampled by
inverse CDF, so memory does not grow with cardinality) and scrambled so that
popular ids are not small integers. Labels come from a hidden logistic model:
per-id weights derived from a hash of ``(field, id)``, a user x item latent
interaction, and a linear term in the dense features. Because the true click
probability of each event is known, the Bayes-optimal AUC can be reported.

When the model has a task named ``conversion``, events also carry a conversion
label: rarer (``generator.conversion_rate`` of the events) and correlated with the
click, because a conversion is drawn only for a clicked event, from its own hidden
logistic model of the same features (other per-id weights, other dense weights). It is
present on ``generator.conversion_labelled`` of the events and missing (NaN) on the
rest. Its draws come from random streams of their own, so the click labels are the
same with or without the conversion task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from streamrec.foundation import EventBatch, JaggedIds, roc_auc, splitmix64, table_salt

_CONVERSION_SCALE = 1.2  # weight of the per-id terms in the conversion model, relative to the click model's


def zipf_ranks(rng: np.random.Generator, n: int, cardinality: int, s: float) -> np.ndarray:
    """Ranks in [0, cardinality) with P(rank r) ~ (r+1)^-s (continuous inverse-CDF approximation)."""
    u = rng.random(n)
    N = float(cardinality)
    if abs(s - 1.0) < 1e-9:
        x = np.power(N + 1.0, u)
    else:
        a = 1.0 - s
        x = np.power(u * (np.power(N + 1.0, a) - 1.0) + 1.0, 1.0 / a)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, cardinality - 1)


def rank_to_id(field: str, ranks: np.ndarray) -> np.ndarray:
    """Scramble ranks into 63-bit non-negative ids, stably per field."""
    h = splitmix64(ranks.astype(np.uint64) ^ np.uint64(table_salt(field)))
    return (h >> np.uint64(1)).astype(np.int64)


def _unit_normal(h: np.ndarray) -> np.ndarray:
    """Two uniform draws from a uint64 hash -> one standard normal (Box-Muller)."""
    u1 = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = ((splitmix64(h) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def id_weight(field: str, ids: np.ndarray, salt: int) -> np.ndarray:
    return _unit_normal(splitmix64(ids.astype(np.uint64) ^ np.uint64(table_salt(field)) ^ np.uint64(salt)))


@dataclass
class SyntheticStream:
    """Generates events for a model config; the same (config, seed) gives the same stream."""

    cfg: object
    chunk: int = 8192

    def __post_init__(self):
        g = self.cfg.generator
        m = self.cfg.model
        self.seed = g.seed
        self.fields = [g.field(f.name) for f in m.fields]  # how each model field is drawn
        rng = np.random.default_rng([g.seed, 12345])
        self.dense_beta = rng.normal(0, 0.5, size=m.dense_dim)
        self.field_scale = {f.name: 0.9 / np.sqrt(len(m.fields)) * (1.6 if f.name in ("user", "item") else 1.0)
                            for f in m.fields}
        names = [f.name for f in m.fields]
        self.pair = (names[0], names[1]) if len(names) >= 2 else None
        self.bias = float(np.log(g.base_rate / (1 - g.base_rate)))
        self.tasks = tuple(t.name for t in getattr(m, "tasks", ())) or ("click",)
        self.conversion = self.tasks.index("conversion") if "conversion" in self.tasks else None
        if self.conversion == 0:
            raise ValueError("the synthetic stream's click label is the first task's: 'conversion' cannot be first")
        if self.conversion is not None:
            if not 0.0 < g.conversion_rate < g.base_rate:
                raise ValueError(f"generator.conversion_rate must be in (0, base_rate = {g.base_rate}), "
                                 f"got {g.conversion_rate}")
            if not 0.0 <= g.conversion_labelled <= 1.0:
                raise ValueError(f"generator.conversion_labelled must be in [0, 1], got {g.conversion_labelled}")
            crng = np.random.default_rng([g.seed, 54321])  # its own stream: the click model's draws are untouched
            self.conversion_beta = crng.normal(0, 0.3, size=m.dense_dim)
            # the bias that makes P(conversion | click) about conversion_rate / base_rate: the logit's terms
            # are ~N(0, var) (unit-normal id weights, standard-normal dense features), and
            # E[sigmoid(b + N(0, var))] ~ sigmoid(b / sqrt(1 + pi var / 8)) (the probit approximation)
            var = sum((_CONVERSION_SCALE * self.field_scale[f.name]) ** 2 for f in self.fields)
            var += float(self.conversion_beta @ self.conversion_beta)
            q = g.conversion_rate / g.base_rate
            self.conversion_bias = float(np.log(q / (1 - q)) * np.sqrt(1 + np.pi * var / 8))

    def _chunk(self, index: int, n: int) -> tuple[EventBatch, np.ndarray]:
        g = self.cfg.generator
        m = self.cfg.model
        rng = np.random.default_rng([self.seed, index])
        logit = np.full(n, self.bias)
        sparse: dict[str, JaggedIds] = {}
        single: dict[str, np.ndarray] = {}
        for f in self.fields:
            total = n * f.multi
            ids = rank_to_id(f.name, zipf_ranks(rng, total, f.cardinality, f.zipf))
            offsets = np.arange(0, total + 1, f.multi, dtype=np.int64)
            sparse[f.name] = JaggedIds(ids, offsets)
            w = id_weight(f.name, ids, self.seed).reshape(n, f.multi).mean(axis=1)
            logit += self.field_scale[f.name] * w
            single[f.name] = ids[:: f.multi]
        if self.pair is not None:
            a, b = self.pair
            ua = np.stack([id_weight(a, single[a], self.seed + k + 1) for k in range(2)], 1)
            vb = np.stack([id_weight(b, single[b], self.seed + k + 11) for k in range(2)], 1)
            logit += 0.5 * (ua * vb).sum(1)
        dense = rng.normal(0, 1, size=(n, m.dense_dim)).astype(np.float32)
        if m.dense_dim:
            logit += dense.astype(np.float64) @ self.dense_beta
        p = 1.0 / (1.0 + np.exp(-logit / g.label_noise))
        labels = (rng.random(n) < p).astype(np.float32)
        start = index * self.chunk
        ts = g.start_ts_ms + ((start + np.arange(n)) * (1000.0 / g.events_per_s)).astype(np.int64)
        batch = EventBatch(ts=ts, labels=labels, dense=dense, sparse=sparse)
        if len(self.tasks) > 1:
            batch.task_labels = np.full((n, len(self.tasks)), np.nan, np.float32)
            batch.task_labels[:, 0] = labels
            batch.task_names = self.tasks
            if self.conversion is not None:
                batch.task_labels[:, self.conversion] = self._conversions(index, n, labels, single, dense)
        return batch, p

    def _conversions(self, index: int, n: int, clicks: np.ndarray, single: dict[str, np.ndarray],
                     dense: np.ndarray) -> np.ndarray:
        """Each event's conversion label (NaN where unlabelled): 1 only for a clicked event, with the probability
        of the conversion's own hidden logistic model; drawn from a random stream of this chunk's own."""
        g = self.cfg.generator
        rng = np.random.default_rng([self.seed, index, 1])
        logit = np.full(n, self.conversion_bias)
        for f in self.fields:
            logit += _CONVERSION_SCALE * self.field_scale[f.name] * id_weight(f.name, single[f.name], self.seed + 101)
        if dense.shape[1]:
            logit += dense.astype(np.float64) @ self.conversion_beta
        q = 1.0 / (1.0 + np.exp(-logit))
        conv = ((clicks > 0) & (rng.random(n) < q)).astype(np.float32)
        conv[rng.random(n) >= g.conversion_labelled] = np.nan
        return conv

    def batches(self, n_events: int, with_truth: bool = False) -> Iterator[EventBatch] | Iterator[tuple[EventBatch, np.ndarray]]:
        """Yield the first ``n_events`` events in chunks (optionally with each event's true probability)."""
        i = 0
        done = 0
        while done < n_events:
            n = min(self.chunk, n_events - done)
            b, p = self._chunk(i, self.chunk)
            if n < self.chunk:
                b, p = b.take(np.arange(n)), p[:n]
            yield (b, p) if with_truth else b
            done += n
            i += 1

    def bayes_auc(self, n_events: int = 100_000) -> float:
        """AUC of the true click probability on the first ``n_events``: the ceiling for any model."""
        labels, probs = [], []
        for b, p in self.batches(n_events, with_truth=True):
            labels.append(b.labels)
            probs.append(p)
        return roc_auc(np.concatenate(labels), np.concatenate(probs))
