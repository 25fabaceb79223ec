"""SlotMap: an id -> slot hash table (open addressing, linear probing) vectorised in numpy.

Why: the host cache's index must cost O(batch) per batch, not O(capacity). A sorted
id array merged with ``np.insert`` moves the whole index on every batch (the largest
single cost of the store at a 2% cache); this table touches only the probed cells.

Why numpy and not a numba kernel: importing numba and loading one cached kernel adds
about a hundred MB of resident memory, more than the whole host-cache budget of the
store's memory goal (BENCHMARKS.md, store). Here every probe round
is a few numpy calls over the ids still unresolved; at load <= 1/2 almost all ids
resolve in the first two rounds.

Cells: ``keys`` (int64) and ``vals`` (int32: slot, -1 empty, -2 deleted). Deleted
cells (tombstones) keep probe chains intact; inserts reuse them, and the table is
rebuilt when live + deleted cells pass 3/4 of it. Any int64 is a valid id.
"""

from __future__ import annotations

import numpy as np

from streamrec.foundation import splitmix64

_EMPTY, _DELETED = -1, -2


class SlotMap:
    def __init__(self, capacity: int):
        size = 1 << max(4, int(2 * max(1, capacity) - 1).bit_length())  # power of two >= 2 * capacity
        self.keys = np.zeros(size, dtype=np.int64)
        self.vals = np.full(size, _EMPTY, dtype=np.int32)
        self.mask = np.uint64(size - 1)
        self.live = 0
        self.deleted = 0

    def __len__(self) -> int:
        return self.live

    def _home(self, ids: np.ndarray) -> np.ndarray:
        h = splitmix64(ids)
        h &= self.mask  # in place; < 2**63, so the int64 view is the same number
        return h.view(np.int64)

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        """Cell of each id, -1 where absent."""
        n = len(ids)
        out = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.live == 0:
            return out
        m = int(self.mask)
        idx = np.arange(n)
        pos = self._home(ids)
        q = ids
        while len(idx):
            v = self.vals[pos]
            hit = (v >= 0) & (self.keys[pos] == q)
            out[idx[hit]] = pos[hit]
            go = ~hit & (v != _EMPTY)
            idx, q, pos = idx[go], q[go], (pos[go] + 1) & m
        return out

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 where absent."""
        p = self._positions(ids)
        return np.where(p >= 0, self.vals[p], -1).astype(np.int64)

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add unique ``ids`` that are certainly absent, mapped to ``slots``."""
        n = len(ids)
        if n == 0:
            return
        if (self.live + self.deleted + n) * 4 > len(self.vals) * 3:
            self._rebuild(extra=n)
        m = int(self.mask)
        q, s, pos = ids, slots.astype(np.int32), self._home(ids)
        while len(q):
            v = self.vals[pos]
            fi = np.flatnonzero(v < 0)
            # several ids may probe the same free cell this round: each writes its mark
            # (-3 - k) there and the one whose mark stays takes the cell (no sort needed)
            marks = -3 - np.arange(len(fi), dtype=np.int32)
            self.vals[pos[fi]] = marks
            won = self.vals[pos[fi]] == marks
            win = fi[won]
            self.deleted -= int((v[win] == _DELETED).sum())
            self.keys[pos[win]] = q[win]
            self.vals[pos[win]] = s[win]
            lose = np.ones(len(q), dtype=bool)
            lose[win] = False
            q, s, pos = q[lose], s[lose], (pos[lose] + 1) & m
        self.live += n

    def remove(self, ids: np.ndarray) -> None:
        """Forget ``ids`` (absent ones are ignored)."""
        p = self._positions(ids)
        p = p[p >= 0]
        self.vals[p] = _DELETED
        self.live -= len(p)
        self.deleted += len(p)

    def clear(self) -> None:
        self.vals[:] = _EMPTY
        self.live = self.deleted = 0

    def _rebuild(self, extra: int = 0) -> None:
        live = np.flatnonzero(self.vals >= 0)
        k, v = self.keys[live], self.vals[live]
        size = len(self.vals)
        while (len(k) + extra) * 2 > size:
            size *= 2
        self.keys = np.zeros(size, dtype=np.int64)
        self.vals = np.full(size, _EMPTY, dtype=np.int32)
        self.mask = np.uint64(size - 1)
        self.live = self.deleted = 0
        self.insert(k, v)

    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes
