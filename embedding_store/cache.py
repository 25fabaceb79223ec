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
- LRU eviction is bulk: when slots run out, the least recently used ``evict_fraction``
  of the cache (``np.argpartition`` on stamps) leaves at once and its dirty rows go
  back in one ``spill`` call (one WriteBatch per shard). Frequency admission evicts
  one row per row admitted, from candidates chosen by one such pass (below).

Admission (``admission="frequency"``, TinyLFU-style): the store feeds every looked-up cold id
to a :class:`FrequencySketch` (``record``). Once the cache is full, a batch of missed rows is
admitted row against row: the rows seen most often are matched, in order, with the eviction
candidates seen least often, and a row gets in only by beating its candidate's count (and
having been seen at least twice lately: TinyLFU's doorkeeper). So the bar is set at every
insert from the rows actually displaced, and a row displaces one row, never a block of them:
rows seen once do not push out rows that come back, and the cache holds the most frequent
cold rows, as an ideal cache of its size would. The candidates are the ``2 x evict_fraction``
least recently used rows, least often seen first, chosen in one pass over the stamps and used
until spent (a candidate used again since it was chosen is skipped: it is not least recent any
more). A row refused is not cached (a dirty one is written back at once: nothing is dropped).
``admission="lru"`` admits every row and evicts in bulk.
"""

from __future__ import annotations

from typing import Callable, get_args

import numpy as np

from .frequency import FrequencySketch
from .rows import gather, scatter
from .slotmap import SlotMap
from .store_types import CacheAdmission

SPILL_CHUNK = 16384  # rows per write-back call
Spill = Callable[[np.ndarray, np.ndarray], None]  # (ids, records) of dirty rows leaving the cache
ADMISSIONS = get_args(CacheAdmission)  # store.cache_admission


class HostCache:
    def __init__(self, capacity: int, dtype: np.dtype, spill: Spill, evict_fraction: float = 0.125,
                 admission: CacheAdmission = "lru"):
        if capacity <= 0:
            raise ValueError(f"host cache capacity must be positive, got {capacity}")
        if admission not in ADMISSIONS:
            raise ValueError(f"host cache admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        # 8 counters per cached row (x 4 sketch rows: 32 bytes a row): fewer collisions, so fewer rows
        # admitted or refused on a shared count
        self.freq = FrequencySketch(capacity, counters_per_row=8) if admission == "frequency" else None
        self.floor = 0  # the count the last refused row had to beat (frequency admission; 0: none refused yet)
        self._pool = np.empty(0, np.int64)  # eviction candidates (frequency admission), least often seen first
        self._pool_stamp = np.empty(0, np.int64)  # their stamps when chosen (a row used since is skipped)
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
            if self.freq.resets != self._resets:  # counts halved: so does the last bar
                self.floor = max(1, self.floor >> (self.freq.resets - self._resets)) if self.floor else 0
                self._resets = self.freq.resets

    def admit(self, ids: np.ndarray) -> np.ndarray:
        """Which of these missed rows the cache takes, making room for them (evicting the candidates
        they beat; see the module doc). All of them under LRU or while there are free slots."""
        k = len(ids)
        if self.freq is None or k <= self._nfree or k > self.capacity:
            return np.ones(k, dtype=bool)
        f = self.freq.estimate(ids)
        order = np.argsort(-f.astype(np.int16), kind="stable")  # seen most often first
        room = self._nfree
        rest = order[room:]  # the best `room` rows take the free slots
        victims, fv = self._candidates(len(rest))
        m = len(victims)
        # best row against weakest candidate, second against second...: f[rest] falls and fv rises,
        # so the rows that win are a prefix
        win = int(np.count_nonzero(f[rest[:m]] > np.maximum(fv, 1)))
        self.floor = int(max(1, fv[win] if win < m else (fv[-1] if m else 1)))
        if win:
            self._drop(victims[:win])
        if win < m:  # candidates not needed stay candidates, weakest first
            self._pool = np.concatenate([victims[win:], self._pool])
            self._pool_stamp = np.concatenate([self.stamp[victims[win:]], self._pool_stamp])
        ok = np.zeros(k, dtype=bool)
        ok[order[:room + win]] = True
        return ok

    def _candidates(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` eviction candidates still unused since chosen, least often seen first, and their counts now."""
        got = []
        have = 0
        for attempt in range(2):  # the pool, then once more after refilling it
            pool, st = self._pool, self._pool_stamp
            valid = self.used[pool] & (self.stamp[pool] == st)
            pool, st = pool[valid], st[valid]
            take = min(n - have, len(pool))
            got.append(pool[:take])
            have += take
            self._pool, self._pool_stamp = pool[take:], st[take:]
            if have >= n or attempt:
                break
            self._refill(exclude=np.concatenate(got))
        victims = np.concatenate(got) if got else np.empty(0, np.int64)
        if not len(victims):
            return victims, np.empty(0, np.uint8)
        fv = self.freq.estimate(self.sid[victims])
        o = np.argsort(fv, kind="stable")
        return victims[o], fv[o]

    def _refill(self, exclude: np.ndarray | None) -> None:
        """The ``2 x evict_batch`` least recently used rows, least often seen first (one pass over the stamps)."""
        used = np.flatnonzero(self.used)
        if exclude is not None and len(exclude):
            keep = np.ones(self.capacity, dtype=bool)
            keep[exclude] = False
            used = used[keep[used]]
        m = min(2 * self.evict_batch, len(used))
        old = used[np.argpartition(self.stamp[used], m - 1)[:m]] if 0 < m < len(used) else used
        o = np.argsort(self.freq.estimate(self.sid[old]), kind="stable")
        self._pool = old[o]
        self._pool_stamp = self.stamp[self._pool]

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

    def write_back(self, ids: np.ndarray, recs: np.ndarray) -> None:
        """Write rows that are not cached (the ones admission refused) straight back to RocksDB."""
        if len(ids):
            self._spill(ids, recs)

    def _spill(self, ids: np.ndarray, recs: np.ndarray) -> None:
        # in chunks: a write-back's transient Python keys/values and WriteBatch cost a few times the
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
