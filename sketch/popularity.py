"""Per-(table, id) popularity with exponential time decay, mergeable and serialisable.

Decay is O(1) per update: counts are kept in *scaled* units relative to a
reference time ``t0``; an event at time ``t`` adds ``2 ** ((t - t0) / half_life)``
and an estimate at time ``now`` is ``scaled * 2 ** ((t0 - now) / half_life)``.
Only when the scale factor grows large are all cells renormalised (one
multiply over the arrays). Time is *event* time (``ts`` of the events), so a
replayed stream decays the same way as a live one.

Updates are micro-batched: ids are copied into a per-field buffer and counted
when it holds ``buffer_ids`` ids (or would span more than 65 s of event time),
and before any read (estimates, top, merge, bytes): every public answer
includes every id given so far. One flush groups equal ids with two value sorts
(``groupby.py``) and then touches the count-min sketch and the heavy hitters
once per *distinct* id, so the fixed numpy cost per call and the per-distinct
work are paid once per ~262k ids rather than per Kafka record.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Mapping, Sequence

import numpy as np

from ingest import EventBatch

from .cms import CountMinSketch
from .groupby import MAX_SPAN_MS, group_ids
from .heavy import HeavyHitters
from .keys import make_keys

_MAGIC = b"SRPS1"
RENORM_HALF_LIVES = 64.0  # renormalise once increments reach 2**64 (float64 has room to spare)


class PopularitySketch:
    """Decayed count-min sketch plus heavy-hitter candidates over the model's sparse fields."""

    def __init__(self, fields: Sequence[str], epsilon: float = 1e-4, delta: float = 1e-3,
                 half_life_s: float = 600.0, top_k: int = 20_000, seed: int = 0, conservative: bool = True,
                 candidates: int | None = None, buffer_ids: int = 1 << 18):
        if not fields:
            raise ValueError("at least one field is needed")
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.fields = list(fields)
        self._field_index = {f: i for i, f in enumerate(self.fields)}
        self.half_life_ms = float(half_life_s) * 1000.0
        self.top_k = int(top_k)
        self._cms = CountMinSketch.from_error(epsilon, delta, seed, conservative)
        # keep more candidates than reported: cheap, and it lifts top-K recall near the cut
        self._hh = HeavyHitters(candidates or max(2 * self.top_k, 64))
        self._init_buffer(buffer_ids)
        self.t0_ms: int | None = None  # reference time of the scaled units
        self.now_ms: int | None = None  # newest event time seen
        self.first_ms: int | None = None  # oldest event time counted
        self.events = 0  # events counted (undecayed)
        self.ids = 0  # id occurrences counted (undecayed)

    # -- updates ---------------------------------------------------------

    def _init_buffer(self, buffer_ids: int) -> None:
        self.buffer_ids = max(0, int(buffer_ids))
        self._buf: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # field index -> [(ids, ts per id)]
        self._buf_n = 0
        self._buf_lo = self._buf_hi = 0

    @property
    def cms(self) -> CountMinSketch:
        self.flush()
        return self._cms

    @property
    def hh(self) -> HeavyHitters:
        self.flush()
        return self._hh

    def _advance(self, lo: int, hi: int) -> None:
        """Track event time; flush first when the new times need a renormalisation or widen the buffer too far."""
        if self.t0_ms is None:
            self.t0_ms = hi
        if (hi - self.t0_ms) / self.half_life_ms > RENORM_HALF_LIVES:
            self.renormalise(hi)  # flushes
        elif self._buf_n and max(hi, self._buf_hi) - min(lo, self._buf_lo) > MAX_SPAN_MS:
            self.flush()
        if self._buf_n == 0:
            self._buf_lo, self._buf_hi = lo, hi
        else:
            self._buf_lo, self._buf_hi = min(lo, self._buf_lo), max(hi, self._buf_hi)
        self.now_ms = hi if self.now_ms is None else max(self.now_ms, hi)
        self.first_ms = lo if self.first_ms is None else min(self.first_ms, lo)

    def _push(self, table: int, ids: np.ndarray, ts: np.ndarray) -> None:
        self._buf.setdefault(table, []).append((ids, ts))
        self._buf_n += len(ids)

    def renormalise(self, t0_ms: int) -> None:
        """Move the reference time to ``t0_ms`` (rescales every count)."""
        if self.t0_ms is None:
            self.t0_ms = int(t0_ms)
            return
        self.flush()
        f = float(np.exp2((self.t0_ms - t0_ms) / self.half_life_ms))
        self._cms.scale(f)
        self._hh.scale(f)
        self.t0_ms = int(t0_ms)

    def update(self, tables: np.ndarray, ids: np.ndarray, ts_ms: np.ndarray) -> None:
        """Count ids: ``tables[i]`` (field index), ``ids[i]`` (int64), seen at ``ts_ms[i]``."""
        n = len(ids)
        if n == 0:
            return
        tables = np.asarray(tables, dtype=np.int16)
        ids = np.array(ids, dtype=np.int64)  # a copy: the buffer must not alias the caller's arrays
        ts = np.array(ts_ms, dtype=np.int64)
        self._advance(int(ts.min()), int(ts.max()))
        for t in np.unique(tables):  # one vectorised pass per table, not per id
            m = tables == t
            self._push(int(t), ids[m], ts[m])
        self.ids += n
        if self._buf_n >= self.buffer_ids:
            self.flush()

    def update_batch(self, batch: EventBatch) -> None:
        """Count every sparse id of a decoded event batch at its event's time."""
        n = len(batch)
        if n == 0:
            return
        ts = np.array(batch.ts, dtype=np.int64)
        self._advance(int(ts.min()), int(ts.max()))
        for f, j in batch.sparse.items():
            ti = self._field_index.get(f)
            if ti is None or len(j.values) == 0:
                continue
            per_id = ts if len(j.values) == n and j.offsets[-1] == n and np.all(j.lengths == 1) \
                else np.repeat(ts, j.lengths)
            self._push(ti, np.array(j.values, dtype=np.int64), per_id)
            self.ids += len(j.values)
        self.events += n
        if self._buf_n >= self.buffer_ids:
            self.flush()

    def flush(self) -> None:
        """Count the buffered ids: group per field, then one sketch update and one heavy-hitter offer."""
        if not self._buf_n:
            return
        buf, self._buf, self._buf_n = self._buf, {}, 0
        keys, tables, ids, weights = [], [], [], []
        for ti, parts in sorted(buf.items()):
            v = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
            ts = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
            g = group_ids(v, ts, self.half_life_ms)
            if g is None:  # too wide a time span, or a 48-bit mix collision: exact argsort grouping
                u, inv = np.unique(v, return_inverse=True)
                w = np.bincount(inv.reshape(-1), weights=np.exp2((ts - self.t0_ms) / self.half_life_ms))
            else:
                u, w, lo = g
                w *= float(np.exp2((lo - self.t0_ms) / self.half_life_ms))
            keys.append(make_keys(self.fields[ti], u))
            tables.append(np.full(len(u), ti, dtype=np.int16))
            ids.append(u)
            weights.append(w)
        k = np.concatenate(keys)
        est = self._cms.add_unique(k, np.concatenate(weights))
        self._hh.offer(k, np.concatenate(tables), np.concatenate(ids), est)

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
        c = self._cms
        p._cms = CountMinSketch(c.width, c.depth, c.seed, c.conservative)
        p._hh = HeavyHitters(self._hh.capacity)
        p._init_buffer(self.buffer_ids)
        p.t0_ms = p.now_ms = p.first_ms = None
        p.events = p.ids = 0
        return p

    def copy(self) -> "PopularitySketch":
        p = self.empty_like()
        p._cms = self.cms.copy()
        p._hh = self.hh.copy()
        p.t0_ms, p.now_ms, p.first_ms = self.t0_ms, self.now_ms, self.first_ms
        p.events, p.ids = self.events, self.ids
        return p

    def to_bytes(self, meta: Mapping | None = None, level: int = 1) -> bytes:
        """Compressed bytes; ``meta`` (JSON-able) rides along, e.g. the Kafka offset it covers."""
        head = json.dumps({
            "fields": self.fields, "half_life_ms": self.half_life_ms, "top_k": self.top_k,
            "t0_ms": self.t0_ms, "now_ms": self.now_ms, "first_ms": self.first_ms,
            "events": self.events, "ids": self.ids, "buffer_ids": self.buffer_ids, "meta": dict(meta or {}),
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
        p._cms, p._hh = cms, hh
        p._init_buffer(int(head.get("buffer_ids", 1 << 18)))
        p.t0_ms, p.now_ms, p.first_ms = head["t0_ms"], head["now_ms"], head["first_ms"]
        p.events, p.ids = int(head["events"]), int(head["ids"])
        return p, dict(head.get("meta") or {})
