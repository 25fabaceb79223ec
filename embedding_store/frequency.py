"""FrequencySketch: how often each id was looked up lately, approximately, in a few bits per cached row.

Why: an LRU cache admits every missed row, so a row seen once (most of a Zipf stream's cold
traffic) pushes out a row that comes back every few batches. TinyLFU (Einziger et al., 2017)
admits a row only when it has been seen more often than the rows it would displace. The counts
come from the ids the store is asked to look up: the trainer's own stream, no extra pass.

A count-min sketch (``DEPTH`` rows of uint8 counters, ``counters_per_row`` per cached row: the host
cache uses 8; no ids stored) over
the looked-up ids; every ``10 x capacity`` additions all counters halve, so it tracks the
recent stream (TinyLFU's reset). Vectorised: a batch of ids is one hash and a few numpy calls
per sketch row. Counts saturate at 255 (only order matters here).
"""

from __future__ import annotations

import numpy as np

from streamrec.foundation import splitmix64

DEPTH = 4
_MULT = tuple(np.uint64(m) for m in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93))


class FrequencySketch:
    def __init__(self, capacity: int, counters_per_row: int = 4, reset_after: int = 10):
        bits = max(10, int(counters_per_row * max(1, capacity) - 1).bit_length())
        self.shift = np.uint64(64 - bits)
        self.table = np.zeros((DEPTH, 1 << bits), dtype=np.uint8)
        self.sample = max(1, reset_after * int(capacity))  # additions between two halvings
        self.added = 0
        self.resets = 0

    def _cells(self, ids: np.ndarray) -> list[np.ndarray]:
        h = splitmix64(np.ascontiguousarray(ids, dtype=np.int64))
        with np.errstate(over="ignore"):
            return [((h * m) >> self.shift).astype(np.intp) for m in _MULT]

    def add(self, ids: np.ndarray) -> None:
        """Count one access of each id (repeats within one call count once)."""
        if not len(ids):
            return
        for row, c in zip(self.table, self._cells(ids)):
            v = row[c]
            np.minimum(v, 254, out=v)
            v += 1
            row[c] = v
        self.added += len(ids)
        if self.added >= self.sample:
            self.table >>= 1
            self.added //= 2
            self.resets += 1

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Recent accesses of each id (an upper bound: collisions only add)."""
        if not len(ids):
            return np.zeros(0, dtype=np.uint8)
        cells = self._cells(ids)
        out = self.table[0][cells[0]]
        for row, c in zip(self.table[1:], cells[1:]):
            np.minimum(out, row[c], out=out)
        return out

    def nbytes(self) -> int:
        return self.table.nbytes
