"""HotIndex: ``(table, id) -> arena slot`` of every hot row, one hash table for all tables.

A training step resolves every id of every table with one compiled pass instead of one sorted
search per table: the per-table loop's Python and the sorted searches' cache misses were the
largest host cost of a step (``bench train --host-ceiling``). Open addressing with linear probing
at load <= 1/2; a cell holds the id, its table's code (-1: empty) and its row in the table's
width's arena. The index is rebuilt whole at each hot-set change (rare), so it never deletes.
Any int64 id of any table is a valid key: a hit compares the id and the table, so a hash
collision never confuses two rows.

Compiled with numba (``cache=True``: on disk after the first process), as serving's id index is:
a vectorised numpy probe makes a dozen passes over the ids per probe round, about six times
the compiled loop's time.
"""

from __future__ import annotations

from typing import Sequence

import numba
import numpy as np

_EMPTY = -1


@numba.njit(cache=True, nogil=True, inline="always")
def _home(salt, key, mask):
    """splitmix64 of ``key ^ salt`` (``streamrec.foundation.splitmix64``'s finaliser), masked to a cell."""
    z = (np.uint64(key) ^ salt) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64((z ^ (z >> np.uint64(31))) & mask)


@numba.njit(cache=True, nogil=True)
def _build(salts, mask, codes, ids, slots, t_ids, t_codes, t_slots):
    m = np.int64(mask)
    for i in range(len(ids)):
        c, k = codes[i], ids[i]
        s = _home(salts[c], k, mask)
        while t_codes[s] != -1:
            s = (s + 1) & m
        t_ids[s], t_codes[s], t_slots[s] = k, c, slots[i]


@numba.njit(cache=True, nogil=True)
def _find(salts, mask, t_ids, t_codes, t_slots, codes, ids, out):
    m = np.int64(mask)
    for i in range(len(ids)):
        c, k = codes[i], ids[i]
        s = _home(salts[c], k, mask)
        r = -1
        while t_codes[s] != -1:
            if t_codes[s] == c and t_ids[s] == k:
                r = t_slots[s]
                break
            s = (s + 1) & m
        out[i] = r


class HotIndex:
    """``find(codes, ids)``: each id's arena slot, -1 where ``(table code, id)`` is not hot."""

    def __init__(self, salts: Sequence[int], codes: np.ndarray, ids: np.ndarray, slots: np.ndarray):
        """``salts[c]``: table ``c``'s 64-bit salt; ``codes``, ``ids``, ``slots``: one entry per hot row
        (``(code, id)`` unique)."""
        self.salts = np.asarray([s & (2**64 - 1) for s in salts] or [0], dtype=np.uint64)
        n = len(ids)
        size = 1 << max(4, int(2 * max(1, n) - 1).bit_length())  # a power of two >= 2n: load <= 1/2
        self.mask = np.uint64(size - 1)
        self.ids = np.zeros(size, np.int64)
        self.codes = np.full(size, _EMPTY, np.int16)
        self.slots = np.zeros(size, np.int64)
        _build(self.salts, self.mask, np.asarray(codes, np.int16), np.asarray(ids, np.int64),
               np.asarray(slots, np.int64), self.ids, self.codes, self.slots)
        self.rows = n

    def find(self, codes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Arena slot of each ``(codes[i], ids[i])``, -1 where it is not hot."""
        out = np.full(len(ids), -1, np.int64)
        if len(ids) and self.rows:
            _find(self.salts, self.mask, self.ids, self.codes, self.slots, np.asarray(codes, np.int16),
                  np.ascontiguousarray(ids, np.int64), out)
        return out

    def nbytes(self) -> int:
        return self.ids.nbytes + self.codes.nbytes + self.slots.nbytes


def index_of(tables: Sequence, arenas: dict) -> HotIndex:
    """The index of ``tables``' hot rows (``Table``s, coded by their order) into their width's arena."""
    tables = list(tables)
    codes, ids, slots = [], [], []
    for c, t in enumerate(tables):
        h = t.hot
        codes.append(np.full(len(h), c, np.int16))
        ids.append(h.ids)
        slots.append(h.slot + arenas[t.dim].base[t.name])
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
    return HotIndex([t.salt for t in tables], cat(codes, np.int16), cat(ids, np.int64), cat(slots, np.int64))
