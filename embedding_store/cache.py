"""Host cache: a bounded, write-back cache of recently used cold rows of one table.

Sits between the device hot tier and RocksDB (one owner tier per row at a time). While a row is in
the cache the cache *owns* it: updates change the cached record and mark it dirty;
RocksDB sees the row again only when it is evicted or flushed (``checkpoint``,
``flush``, ``close``). That turns "one RocksDB read + one write per cold row per
batch" into "one read per miss + one write per evicted dirty row", batched.

Vectorised throughout (no Python per id):
- slots are one structured array of packed records (the RocksDB value layout, so a
  write-back is a zero-copy view) plus per-slot id, LRU stamp, dirty and stored bits;
- the id -> slot index is a vectorised hash table (``slotmap.py``): O(batch) per
  batch, where a sorted array merged with ``np.insert`` cost O(capacity);
- eviction is bulk: when slots run out, the least recently used ``evict_fraction``
  of the cache (``np.argpartition`` on stamps) leaves at once and its dirty rows go
  back in one ``spill`` call (one WriteBatch per shard).

Admission (``admission="frequency"``, TinyLFU-style): the store feeds every looked-up cold id
to a :class:`FrequencySketch` (``record``). Eviction then takes, of the ``2 x evict_fraction``
least recently used rows, the half seen least often, and remembers how often those were seen
(the median, at least 1: ``floor``). A missed row is admitted only when it was seen more often
than that (so at least twice lately: TinyLFU's doorkeeper);
a row refused is not cached (a dirty one is written back at once: nothing is dropped). So
rows seen once do not push out rows that come back, and the cache holds the most frequent
cold rows, as an ideal cache of its size would. ``admission="lru"`` admits every row.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .frequency import FrequencySketch
from .rows import gather, scatter
from .slotmap import SlotMap

SPILL_CHUNK = 16384  # rows per write-back call
Spill = Callable[[np.ndarray, np.ndarray], None]  # (ids, records) of dirty rows leaving the cache
ADMISSIONS = ("frequency", "lru")


class HostCache:
    def __init__(self, capacity: int, dtype: np.dtype, spill: Spill, evict_fraction: float = 0.125,
                 admission: str = "lru"):
        if capacity <= 0:
            raise ValueError(f"host cache capacity must be positive, got {capacity}")
        if admission not in ADMISSIONS:
            raise ValueError(f"host cache admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        self.freq = FrequencySketch(capacity) if admission == "frequency" else None
        self.floor = 0  # a row is admitted only when seen more often than this (frequency admission)
        self._resets = 0
        self.refused = 0
        self.capacity = int(capacity)
        self.rec = np.zeros(self.capacity, dtype=dtype)
        self.sid = np.zeros(self.capacity, dtype=np.int64)       # id held by each slot
        self.used = np.zeros(self.capacity, dtype=bool)
        self.dirty = np.zeros(self.capacity, dtype=bool)         # newer than RocksDB's copy
        self.stored = np.zeros(self.capacity, dtype=bool)        # the row exists (in RocksDB or dirty here)
        self.stamp = np.zeros(self.capacity, dtype=np.int64)     # LRU clock of the last use
        self.index = SlotMap(self.capacity)                      # cached id -> slot
        self._free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)  # stack of free slots
        self._nfree = self.capacity
        self.clock = 0
        self.gen = 0  # bumped whenever an id gains or loses a slot (validates remembered slots)
        self.evict_batch = max(1, int(self.capacity * evict_fraction))
        self.spill = spill
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.spilled = 0

    def __len__(self) -> int:
        return len(self.index)

    # -- index ---------------------------------------------------------------------
    def find(self, ids: np.ndarray) -> np.ndarray:
        """Slot per id, -1 where not cached (no LRU effect)."""
        return self.index.get(ids)

    def lookup(self, ids: np.ndarray, count: bool = True, slots: np.ndarray | None = None) -> np.ndarray:
        """``find`` + mark the hits as just used; ``count``: add to the hit/miss counters.
        ``slots``: ``find(ids)`` already made under the current ``gen`` (skips the probe)."""
        if slots is None:
            slots = self.find(ids)
        hit = slots >= 0
        self.clock += 1
        self.stamp[slots[hit]] = self.clock
        if count:
            nh = int(hit.sum())
            self.hits += nh
            self.misses += len(ids) - nh
        return slots

    def record(self, ids: np.ndarray) -> None:
        """Count a lookup of ``ids`` (cached or not) for frequency admission; no-op under LRU."""
        if self.freq is not None:
            self.freq.add(ids)
            if self.freq.resets != self._resets:  # counts halved: so does the bar they are compared to
                self.floor = max(1, self.floor >> (self.freq.resets - self._resets)) if self.floor else 0
                self._resets = self.freq.resets

    def admit(self, ids: np.ndarray) -> np.ndarray:
        """Which of these missed rows the cache takes (all, under LRU or before its first eviction)."""
        if self.freq is None or self.floor == 0:  # 0: nothing evicted yet, there is room for every row
            return np.ones(len(ids), dtype=bool)
        return self.freq.estimate(ids) > self.floor

    # -- updates ---------------------------------------------------------------------
    def update(self, slots: np.ndarray, recs: np.ndarray) -> None:
        """New records for cached rows (they become dirty and stored)."""
        scatter(self.rec, slots, recs)
        self.dirty[slots] = True
        self.stored[slots] = True

    def insert(self, ids: np.ndarray, recs: np.ndarray, stored: np.ndarray, dirty: bool) -> np.ndarray:
        """Add rows not cached yet (unique ``ids``), evicting the least recently used if full;
        returns each row's slot.

        Rows that cannot fit even in an empty cache (a batch larger than the capacity), and
        rows frequency admission refuses, get slot -1 and are spilled at once when dirty, so
        nothing is ever dropped.
        """
        k = len(ids)
        out = np.full(k, -1, dtype=np.int64)
        if k == 0:
            return out
        ok = self.admit(ids)
        if not ok.all():
            no = ~ok
            self.refused += int(np.count_nonzero(no))
            if dirty:
                self._spill(ids[no], recs[no])
            keep = np.flatnonzero(ok)
            out[keep] = self._insert(ids[keep], recs[keep], stored[keep], dirty)
            return out
        return self._insert(ids, recs, stored, dirty)

    def _insert(self, ids: np.ndarray, recs: np.ndarray, stored: np.ndarray, dirty: bool) -> np.ndarray:
        k = len(ids)
        out = np.full(k, -1, dtype=np.int64)
        if k == 0:
            return out
        self.gen += 1
        cut = 0
        if k > self.capacity:  # keep the last `capacity` rows, spill the rest
            cut = k - self.capacity
            if dirty:
                self._spill(ids[:cut], recs[:cut])
            ids, recs, stored, k = ids[cut:], recs[cut:], stored[cut:], self.capacity
        if k > self._nfree:
            self.evict(max(k - self._nfree, self.evict_batch))
        slots = self._free[self._nfree - k:self._nfree].copy()
        self._nfree -= k
        self.clock += 1
        scatter(self.rec, slots, recs)
        self.sid[slots] = ids
        self.used[slots] = True
        self.dirty[slots] = dirty
        self.stored[slots] = stored | dirty
        self.stamp[slots] = self.clock
        self.index.insert(ids, slots)
        out[cut:] = slots
        return out

    def evict(self, n: int) -> int:
        """Drop the ``n`` least recently used rows, spilling the dirty ones first."""
        used = np.flatnonzero(self.used)
        n = min(n, len(used))
        if n <= 0:
            return 0
        if self.freq is not None and n < len(used):  # of the 2n least recent, the n seen least often
            m = min(2 * n, len(used))
            old = used[np.argpartition(self.stamp[used], m - 1)[:m]] if m < len(used) else used
            f = self.freq.estimate(self.sid[old])
            pick = np.argpartition(f, n - 1)[:n]
            victims = old[pick]
            self.floor = max(1, int(np.median(f[pick])))  # >= 1: a row seen once (now) waits for its second sighting
        elif n < len(used):
            victims = used[np.argpartition(self.stamp[used], n - 1)[:n]]
        else:
            victims = used
        self._drop(victims)
        return n

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Remove ``ids`` from the cache without writing them back (the caller becomes their
        owner, e.g. a promotion to the hot tier). Returns (hit, records, stored, dirty)."""
        slots = self.find(ids)
        hit = slots >= 0
        s = slots[hit]
        out = (hit, gather(self.rec, s), self.stored[s].copy(), self.dirty[s].copy())
        if len(s):
            self._release(s)
        return out

    def _drop(self, victims: np.ndarray) -> None:
        d = victims[self.dirty[victims]]
        if len(d):
            self._spill(self.sid[d], gather(self.rec, d))
            self.dirty[d] = False
        self.evicted += len(victims)
        self._release(victims)

    def _release(self, slots: np.ndarray) -> None:
        self.gen += 1
        self.index.remove(self.sid[slots])
        self.used[slots] = False
        self.dirty[slots] = False
        self._free[self._nfree:self._nfree + len(slots)] = slots
        self._nfree += len(slots)

    def _spill(self, ids: np.ndarray, recs: np.ndarray) -> None:
        # in chunks: a write-back's transient Python keys/values and WriteBatch cost ~3x the
        # rows' bytes, which for a whole-cache flush would be the process's peak memory
        for lo in range(0, len(ids), SPILL_CHUNK):
            self.spill(np.ascontiguousarray(ids[lo:lo + SPILL_CHUNK]), np.ascontiguousarray(recs[lo:lo + SPILL_CHUNK]))
        self.spilled += len(ids)

    # -- write-back ------------------------------------------------------------------
    def flush(self) -> int:
        """Write every dirty row back (rows stay cached, now clean); returns how many."""
        d = np.flatnonzero(self.dirty & self.used)
        d = d[np.argsort(self.sid[d])]
        for lo in range(0, len(d), SPILL_CHUNK):
            c = d[lo:lo + SPILL_CHUNK]
            self._spill(self.sid[c], gather(self.rec, c))
        self.dirty[d] = False
        return len(d)

    def clear(self) -> None:
        """Flush, then forget every row."""
        self.flush()
        used = np.flatnonzero(self.used)
        if len(used):
            self._release(used)

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, records, stored) of every cached row."""
        s = np.flatnonzero(self.used)
        return self.sid[s], gather(self.rec, s), self.stored[s]

    def dirty_count(self) -> int:
        return int((self.dirty & self.used).sum())

    def nbytes(self) -> int:
        per_slot = self.rec.dtype.itemsize + 8 + 8 + 8 + 3  # record, id, stamp, free stack, bits
        return self.capacity * per_slot + self.index.nbytes() + (self.freq.nbytes() if self.freq is not None else 0)
