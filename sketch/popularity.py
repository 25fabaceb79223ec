"""Per-(table, id) popularity with exponential time decay, mergeable and serialisable.

Decay is O(1) per update: counts are kept in *scaled* units relative to a
reference time ``t0``; an event at time ``t`` adds ``2 ** ((t - t0) / half_life)``
and an estimate at time ``now`` is ``scaled * 2 ** ((t0 - now) / half_life)``.
Only when the scale factor grows large are all cells renormalised (one
multiply over the arrays). Time is *event* time (``ts`` of the events), so a
replayed stream decays the same way as a live one.

Updates are pre-aggregated: each id's event weight is summed into a small
hash table of distinct ``(table, id)`` keys (``kernels.Accumulator``, compiled)
as it arrives; the table is flushed into the count-min sketch and the heavy
hitters when it fills, after ``buffer_ids`` ids, and before any read
(estimates, top, merge, bytes), so every public answer includes every id
given so far. A flush touches the count-min cells and the heavy-hitter
candidates once per *distinct* key, and offers the heavy hitters only keys
whose estimate beats the current floor.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Mapping, Sequence

import numpy as np

from streamrec.foundation import EventBatch

from .cms import CountMinSketch
from .heavy import HeavyHitters
from .kernels import Accumulator
from .keys import key_salt, make_keys

_MAGIC = b"SRPS2"  # 2: keys salted with foundation.table_salt
_MAGIC_V1 = b"SRPS1"  # 1: keys salted with a sketch-only salt; readable for its meta (next offset) only
RENORM_HALF_LIVES = 64.0  # renormalise once increments reach 2**64 (float64 has room to spare)
ACC_DISTINCT = 1 << 16  # distinct keys pre-aggregated between flushes (2^17 slots, ~3.5 MB)


class PopularitySketch:
    """Decayed count-min sketch plus heavy-hitter candidates over the model's sparse fields."""

    def __init__(self, fields: Sequence[str], epsilon: float = 1e-4, delta: float = 1e-3,
                 half_life_s: float = 600.0, top_k: int = 20_000, seed: int = 0, conservative: bool = True,
                 candidates: int | None = None, buffer_ids: int = 1 << 22, *, cms: CountMinSketch | None = None,
                 hh: HeavyHitters | None = None):
        """``cms`` / ``hh``: the count-min sketch and heavy hitters to hold (a copy's or a snapshot's) instead
        of empty ones sized by ``epsilon``, ``delta`` and ``candidates``."""
        if not fields:
            raise ValueError("at least one field is needed")
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.fields = list(fields)
        self._field_index = {f: i for i, f in enumerate(self.fields)}
        self.half_life_ms = float(half_life_s) * 1000.0
        self.top_k = int(top_k)
        self._cms = cms if cms is not None else CountMinSketch.from_error(epsilon, delta, seed, conservative)
        # keep more candidates than reported: cheap, and it lifts top-K recall near the cut
        self._hh = hh if hh is not None else HeavyHitters(candidates or max(2 * self.top_k, 64))
        self._init_buffer(buffer_ids)
        self.t0_ms: int | None = None  # reference time of the scaled units
        self.now_ms: int | None = None  # newest event time seen
        self.first_ms: int | None = None  # oldest event time counted
        self.events = 0  # events counted (undecayed)
        self.ids = 0  # id occurrences counted (undecayed)

    # -- updates ---------------------------------------------------------

    def _init_buffer(self, buffer_ids: int) -> None:
        self.buffer_ids = max(0, int(buffer_ids))
        self._acc = Accumulator(min(ACC_DISTINCT, max(self.buffer_ids, 1 << 10)))
        self._salts = [key_salt(f) for f in self.fields]
        self._buf_n = 0  # ids given since the last flush

    @property
    def cms(self) -> CountMinSketch:
        self.flush()
        return self._cms

    @property
    def hh(self) -> HeavyHitters:
        self.flush()
        return self._hh

    def _advance(self, lo: int, hi: int) -> None:
        """Track event time; renormalise (after a flush) when the new times would make weights too large."""
        if self.t0_ms is None:
            self.t0_ms = hi
        if (hi - self.t0_ms) / self.half_life_ms > RENORM_HALF_LIVES:
            self.renormalise(hi)  # flushes
        self.now_ms = hi if self.now_ms is None else max(self.now_ms, hi)
        self.first_ms = lo if self.first_ms is None else min(self.first_ms, lo)

    def _weights(self, ts: np.ndarray) -> np.ndarray:
        """Scaled decay weight of each time: ``2 ** ((ts - t0) / half_life)``."""
        return np.exp2((ts - self.t0_ms) / self.half_life_ms)

    def _count(self, table: int, values: np.ndarray, offsets: np.ndarray, weights: np.ndarray) -> None:
        """Sum ``weights[e]`` into every id of row ``e`` of one table (flushing whenever the accumulator fills)."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if len(offsets) > 1 and int(np.diff(offsets).max()) > self._acc.capacity:
            offsets, weights = _split_rows(offsets, weights, self._acc.capacity)
        rows, at = len(offsets) - 1, 0
        while True:
            at = self._acc.add(table, self._salts[table], True, values, offsets, weights, at)
            if at >= rows:
                break
            self.flush()
        self._buf_n += len(values)

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
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        ts = np.asarray(ts_ms, dtype=np.int64)
        if len(tables) != n or len(ts) != n:
            raise ValueError(f"tables, ids and ts_ms differ in length: {len(tables)}, {n}, {len(ts)}")
        lo, hi = int(tables.min()), int(tables.max())
        if lo < 0 or hi >= len(self.fields):
            raise ValueError(f"table index out of range 0..{len(self.fields) - 1}: {lo if lo < 0 else hi}")
        self._advance(int(ts.min()), int(ts.max()))
        w = self._weights(ts)
        if lo == hi:
            self._count(lo, ids, np.arange(n + 1, dtype=np.int64), w)
        else:
            for t in np.unique(tables):  # one compiled pass per table, not per id
                m = tables == t
                k = int(m.sum())
                self._count(int(t), ids[m], np.arange(k + 1, dtype=np.int64), w[m])
        self.ids += n
        if self._buf_n >= self.buffer_ids:
            self.flush()

    def update_batch(self, batch: EventBatch) -> None:
        """Count every sparse id of a decoded event batch at its event's time."""
        n = len(batch)
        if n == 0:
            return
        ts = np.asarray(batch.ts, dtype=np.int64)
        self._advance(int(ts.min()), int(ts.max()))
        w = self._weights(ts)  # one weight per event, shared by all of its ids
        for f, j in batch.sparse.items():
            ti = self._field_index.get(f)
            if ti is None or len(j.values) == 0:
                continue
            if len(j.offsets) != n + 1:
                raise ValueError(f"field {f!r} has {len(j.offsets) - 1} rows, the batch {n} events")
            self._count(ti, j.values, j.offsets, w)
            self.ids += len(j.values)
        self.events += n
        if self._buf_n >= self.buffer_ids:
            self.flush()

    def flush(self) -> None:
        """Count the pre-aggregated keys: one count-min update per distinct key, then offer the heavy hitters."""
        self._buf_n = 0
        acc = self._acc
        if not acc.n:
            return
        slots = acc.order[:acc.n]
        est = self._cms.apply(acc)  # empties acc; its key, table and id arrays stay readable until the next add
        floor = self._hh.floor
        if floor > 0:  # only a key that beats the current floor can become a candidate
            sel = np.flatnonzero(est > floor)
            slots, est = slots[sel], est[sel]
        self._hh.offer(acc.kw[slots, 0], acc.tables[slots], acc.ids[slots], est)

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
        c = self._cms
        return self._like(CountMinSketch(c.width, c.depth, c.seed, c.conservative), HeavyHitters(self._hh.capacity))

    def copy(self) -> "PopularitySketch":
        p = self._like(self.cms.copy(), self.hh.copy())
        p.t0_ms, p.now_ms, p.first_ms = self.t0_ms, self.now_ms, self.first_ms
        p.events, p.ids = self.events, self.ids
        return p

    def _like(self, cms: CountMinSketch, hh: HeavyHitters) -> "PopularitySketch":
        """A sketch of this one's fields, decay, ``top_k`` and buffer, holding ``cms`` and ``hh``, no events."""
        p = PopularitySketch(self.fields, half_life_s=self.half_life_ms / 1000.0, top_k=self.top_k,
                             buffer_ids=self.buffer_ids, cms=cms, hh=hh)
        p.half_life_ms = self.half_life_ms  # exactly this one's (a division and a product may differ in the last bit)
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
        if not b or bytes(b[:5]) not in (_MAGIC, _MAGIC_V1):
            raise ValueError("not a serialised PopularitySketch (bad magic)")
        try:
            body = zlib.decompress(b[5:])
            nh, nc, nhh = struct.unpack("<III", body[:12])
            head = json.loads(body[12:12 + nh])
            cms = CountMinSketch.from_bytes(memoryview(body)[12 + nh:12 + nh + nc])
            hh = HeavyHitters.from_bytes(body[12 + nh + nc:12 + nh + nc + nhh])
        except (zlib.error, struct.error, json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"corrupt PopularitySketch bytes: {e}") from None
        half_life_ms = float(head["half_life_ms"])
        p = PopularitySketch(list(head["fields"]), half_life_s=half_life_ms / 1000.0, top_k=int(head["top_k"]),
                             buffer_ids=int(head.get("buffer_ids", 1 << 22)), cms=cms, hh=hh)
        p.half_life_ms = half_life_ms  # exactly the snapshot's (a division and a product may differ in the last bit)
        p.t0_ms, p.now_ms, p.first_ms = head["t0_ms"], head["now_ms"], head["first_ms"]
        p.events, p.ids = int(head["events"]), int(head["ids"])
        meta = dict(head.get("meta") or {})
        if bytes(b[:5]) == _MAGIC_V1:
            meta["stale_keys"] = True  # its counts are under keys this version never looks up
        return p, meta


def _split_rows(offsets: np.ndarray, weights: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of more than ``cap`` ids cut into pieces of at most ``cap``, each with its row's weight.

    Every id still gets its event's weight once, so counts are unchanged; the accumulator
    then never meets a row bigger than itself (one event with a huge multi-valued field
    must be counted, not crash the worker on every restart)."""
    lengths = np.diff(offsets)
    pieces = np.maximum(1, -(-lengths // cap))
    row = np.repeat(np.arange(len(lengths)), pieces)
    k = np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece number within its row
    starts = offsets[:-1][row] + k * cap
    return np.append(starts, offsets[-1]).astype(np.int64), np.ascontiguousarray(weights[:len(lengths)][row], np.float64)
