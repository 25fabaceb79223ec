"""An immutable open-addressing hash index: int64 id -> row number, compiled with numba.

Why: resolving a Predict request's ids against the in-memory rows with
``np.searchsorted`` is a branchy binary search per id, slower as the index grows; a
Fibonacci-hashed table with linear probing answers in a few probes per id,
independent of the index size. Built once per
served version and only read afterwards, so requests share it without a lock.
"""

from __future__ import annotations

import numba
import numpy as np

@numba.njit(cache=True, nogil=True)
def _build(ids, rows, shift, keys, vals):
    mask = len(keys) - 1
    for i in range(len(ids)):
        k = ids[i]
        h = (np.uint64(k) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift)
        s = np.int64(h)
        while vals[s] >= 0 and keys[s] != k:
            s = (s + 1) & mask
        keys[s] = k
        vals[s] = rows[i]


@numba.njit(cache=True, nogil=True)
def _find(keys, vals, shift, ids, missing, out):
    mask = len(keys) - 1
    misses = 0
    for i in range(len(ids)):
        k = ids[i]
        h = (np.uint64(k) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift)
        s = np.int64(h)
        r = missing
        while vals[s] >= 0:
            if keys[s] == k:
                r = vals[s]
                break
            s = (s + 1) & mask
        if r == missing:
            misses += 1
        out[i] = r
    return misses


class IdIndex:
    """``find(ids, missing)`` -> the row of each id (``missing`` where absent) and the miss count."""

    def __init__(self, ids: np.ndarray, rows: np.ndarray | None = None):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.arange(len(ids), dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
        bits = max(4, int(2 * max(1, len(ids)) - 1).bit_length())  # load factor <= 1/2
        self.shift = 64 - bits
        self.keys = np.zeros(1 << bits, dtype=np.int64)
        self.vals = np.full(1 << bits, -1, dtype=np.int64)
        self.size = len(ids)
        if len(ids):
            _build(ids, rows, self.shift, self.keys, self.vals)

    def find(self, ids: np.ndarray, missing: int) -> tuple[np.ndarray, int]:
        out = np.empty(len(ids), dtype=np.int64)
        if self.size == 0:
            out.fill(missing)
            return out, len(ids)
        misses = _find(self.keys, self.vals, self.shift, np.ascontiguousarray(ids, dtype=np.int64), missing, out)
        return out, int(misses)
