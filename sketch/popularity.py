"""Per-(table, id) popularity with exponential time decay, mergeable and serialisable.

Decay is O(1) per update: counts are kept in *scaled* units relative to a
reference time ``t0``; an event at time ``t`` adds ``2 ** ((t - t0) / half_life)``
and an estimate at time ``now`` is ``scaled * 2 ** ((t0 - now) / half_life)``.
Only when the scale factor grows large are all cells renormalised (one
multiply over the arrays). Time is *event* time (``ts`` of the events), so a
replayed stream decays the same way as a live one.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Mapping, Sequence

import numpy as np

from ingest import EventBatch

from .cms import CountMinSketch, aggregate
from .heavy import HeavyHitters
from .keys import make_keys

_MAGIC = b"SRPS1"
RENORM_HALF_LIVES = 64.0  # renormalise once increments reach 2**64 (float64 has room to spare)


class PopularitySketch:
    """Decayed count-min sketch plus heavy-hitter candidates over the model's sparse fields."""

    def __init__(self, fields: Sequence[str], epsilon: float = 1e-4, delta: float = 1e-3,
                 half_life_s: float = 600.0, top_k: int = 20_000, seed: int = 0, conservative: bool = True,
                 candidates: int | None = None):
        if not fields:
            raise ValueError("at least one field is needed")
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.fields = list(fields)
        self._field_index = {f: i for i, f in enumerate(self.fields)}
        self.half_life_ms = float(half_life_s) * 1000.0
        self.top_k = int(top_k)
        self.cms = CountMinSketch.from_error(epsilon, delta, seed, conservative)
        # keep more candidates than reported: cheap, and it lifts top-K recall near the cut
        self.hh = HeavyHitters(candidates or max(2 * self.top_k, 64))
        self.t0_ms: int | None = None  # reference time of the scaled units
        self.now_ms: int | None = None  # newest event time seen
        self.first_ms: int | None = None  # oldest event time counted
        self.events = 0  # events counted (undecayed)
        self.ids = 0  # id occurrences counted (undecayed)

    # -- updates ---------------------------------------------------------

    def _weights(self, ts: np.ndarray) -> np.ndarray:
        ts = np.asarray(ts, dtype=np.int64)
        hi, lo = int(ts.max()), int(ts.min())
        if self.t0_ms is None:
            self.t0_ms = hi
        if (hi - self.t0_ms) / self.half_life_ms > RENORM_HALF_LIVES:
            self.renormalise(hi)
        self.now_ms = hi if self.now_ms is None else max(self.now_ms, hi)
        self.first_ms = lo if self.first_ms is None else min(self.first_ms, lo)
        return np.exp2((ts - self.t0_ms) / self.half_life_ms)

    def renormalise(self, t0_ms: int) -> None:
        """Move the reference time to ``t0_ms`` (rescales every count)."""
        if self.t0_ms is None:
            self.t0_ms = int(t0_ms)
            return
        f = float(np.exp2((self.t0_ms - t0_ms) / self.half_life_ms))
        self.cms.scale(f)
        self.hh.scale(f)
        self.t0_ms = int(t0_ms)

    def update(self, tables: np.ndarray, ids: np.ndarray, ts_ms: np.ndarray) -> None:
        """Count ids: ``tables[i]`` (field index), ``ids[i]`` (int64), seen at ``ts_ms[i]``."""
        n = len(ids)
        if n == 0:
            return
        tables = np.asarray(tables, dtype=np.int16)
        ids = np.asarray(ids, dtype=np.int64)
        keys = np.empty(n, dtype=np.uint64)
        for t in np.unique(tables):  # one vectorised pass per table, not per id
            m = tables == t
            keys[m] = make_keys(self.fields[int(t)], ids[m])
        self._update_keys(keys, tables, ids, self._weights(ts_ms))
        self.ids += n

    def update_batch(self, batch: EventBatch) -> None:
        """Count every sparse id of a decoded event batch at its event's time."""
        if len(batch) == 0:
            return
        w_event = self._weights(batch.ts)
        keys, tables, ids, weights = [], [], [], []
        for f, j in batch.sparse.items():
            ti = self._field_index.get(f)
            if ti is None or len(j.values) == 0:
                continue
            keys.append(make_keys(f, j.values))
            tables.append(np.full(len(j.values), ti, dtype=np.int16))
            ids.append(j.values)
            weights.append(np.repeat(w_event, j.lengths))
        if keys:
            k = np.concatenate(keys)
            self._update_keys(k, np.concatenate(tables), np.concatenate(ids), np.concatenate(weights))
            self.ids += len(k)
        self.events += len(batch)

    def _update_keys(self, keys, tables, ids, weights) -> None:
        agg = aggregate(keys, weights)
        est = self.cms.add_unique(agg.keys, agg.weights)
        self.hh.offer(agg.keys, tables[agg.first], ids[agg.first], est)

    # -- queries ---------------------------------------------------------

    def decay_factor(self, at_ms: int | None = None) -> float:
        """Multiply scaled units by this to get counts decayed to ``at_ms`` (default: newest event)."""
        if self.t0_ms is None:
            return 1.0
        at = self.now_ms if at_ms is None else at_ms
        return float(np.exp2((self.t0_ms - at) / self.half_life_ms))

    def estimate(self, field: str, ids: np.ndarray, at_ms: int | None = None) -> np.ndarray:
        """Decayed count estimates (never below the true decayed count)."""
        keys = make_keys(field, np.asarray(ids, dtype=np.int64))
        return self.cms.estimate(keys) * self.decay_factor(at_ms)

    @property
    def total(self) -> float:
        """Decayed total weight (the N in the epsilon * N error bound)."""
        return self.cms.total * self.decay_factor()

    def top(self, k: int | None = None, at_ms: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(table index, id, decayed estimate) of the ``k`` (default ``top_k``) hottest, hottest first."""
        _, tables, ids, est = self.hh.top(self.top_k if k is None else k)
        return tables, ids, est * self.decay_factor(at_ms)

    def candidates(self, at_ms: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every kept candidate (table index, id, decayed estimate), hottest first."""
        _, tables, ids, est = self.hh.top(None)
        return tables, ids, est * self.decay_factor(at_ms)

    # -- merge and bytes ---------------------------------------------------

    def _check_compatible(self, other: "PopularitySketch") -> None:
        if other.fields != self.fields:
            raise ValueError(f"cannot merge sketches over different fields: {self.fields} vs {other.fields}")
        if other.half_life_ms != self.half_life_ms:
            raise ValueError("cannot merge sketches with different half-lives")
        if not self.cms.compatible(other.cms):
            raise ValueError("cannot merge sketches with different count-min shapes or seeds")

    def merge(self, other: "PopularitySketch") -> "PopularitySketch":
        """Add ``other`` into this sketch (aligned to the later reference time); returns self."""
        self._check_compatible(other)
        if other.t0_ms is None:
            return self
        o = other.copy()
        if self.t0_ms is None:
            self.t0_ms = o.t0_ms
        t0 = max(self.t0_ms, o.t0_ms)
        self.renormalise(t0)
        o.renormalise(t0)
        self.cms.merge(o.cms)
        keys, tables, ids = self.hh.union_with(o.hh)
        self.hh.replace(keys, tables, ids, self.cms.estimate(keys))
        self.now_ms = o.now_ms if self.now_ms is None else max(self.now_ms, o.now_ms)
        self.first_ms = o.first_ms if self.first_ms is None else min(self.first_ms, o.first_ms)
        self.events += o.events
        self.ids += o.ids
        return self

    def empty_like(self) -> "PopularitySketch":
        p = PopularitySketch.__new__(PopularitySketch)
        p.fields = list(self.fields)
        p._field_index = dict(self._field_index)
        p.half_life_ms = self.half_life_ms
        p.top_k = self.top_k
        p.cms = CountMinSketch(self.cms.width, self.cms.depth, self.cms.seed, self.cms.conservative)
        p.hh = HeavyHitters(self.hh.capacity)
        p.t0_ms = p.now_ms = p.first_ms = None
        p.events = p.ids = 0
        return p

    def copy(self) -> "PopularitySketch":
        p = self.empty_like()
        p.cms = self.cms.copy()
        p.hh = self.hh.copy()
        p.t0_ms, p.now_ms, p.first_ms = self.t0_ms, self.now_ms, self.first_ms
        p.events, p.ids = self.events, self.ids
        return p

    def to_bytes(self, meta: Mapping | None = None, level: int = 1) -> bytes:
        """Compressed bytes; ``meta`` (JSON-able) rides along, e.g. the Kafka offset it covers."""
        head = json.dumps({
            "fields": self.fields, "half_life_ms": self.half_life_ms, "top_k": self.top_k,
            "t0_ms": self.t0_ms, "now_ms": self.now_ms, "first_ms": self.first_ms,
            "events": self.events, "ids": self.ids, "meta": dict(meta or {}),
        }).encode()
        cms, hh = self.cms.to_bytes(), self.hh.to_bytes()
        body = struct.pack("<III", len(head), len(cms), len(hh)) + head + cms + hh
        return _MAGIC + zlib.compress(body, level)

    @classmethod
    def from_bytes(cls, b: bytes) -> "PopularitySketch":
        p, _ = cls.from_bytes_with_meta(b)
        return p

    @classmethod
    def from_bytes_with_meta(cls, b: bytes) -> tuple["PopularitySketch", dict]:
        if not b or bytes(b[:5]) != _MAGIC:
            raise ValueError("not a serialised PopularitySketch (bad magic)")
        try:
            body = zlib.decompress(b[5:])
            nh, nc, nhh = struct.unpack("<III", body[:12])
            head = json.loads(body[12:12 + nh])
            cms = CountMinSketch.from_bytes(memoryview(body)[12 + nh:12 + nh + nc])
            hh = HeavyHitters.from_bytes(body[12 + nh + nc:12 + nh + nc + nhh])
        except (zlib.error, struct.error, json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"corrupt PopularitySketch bytes: {e}") from None
        p = PopularitySketch.__new__(PopularitySketch)
        p.fields = list(head["fields"])
        p._field_index = {f: i for i, f in enumerate(p.fields)}
        p.half_life_ms = float(head["half_life_ms"])
        p.top_k = int(head["top_k"])
        p.cms, p.hh = cms, hh
        p.t0_ms, p.now_ms, p.first_ms = head["t0_ms"], head["now_ms"], head["first_ms"]
        p.events, p.ids = int(head["events"]), int(head["ids"])
        return p, dict(head.get("meta") or {})
