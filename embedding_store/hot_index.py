"""HotIndex: ``(table, id) -> arena slot`` of every hot row, one hash table for all tables.

A training step resolves every id of every table with one probe instead of one sorted search
per table: no Python per table, and a hash probe touches one or two cells where a binary search
misses cache at every level. Open addressing with linear probing
at load <= 1/2; a cell holds the id, its table's code (-1: empty) and its row in the table's
width's arena. The index is rebuilt whole at each hot-set change (rare), so it never deletes.
Any int64 id of any table is a valid key: a hit compares the id and the table, so a hash
collision never confuses two rows.

The probe comes in two forms with the same answers. Compiled (``hot_index_kernel.py``, numba, as
serving's id index is): one pass over the ids, where the vectorised numpy probe makes a dozen per
probe round; but loading numba and the kernel costs the process resident memory. A store on a CUDA device uses the compiled probe (there the host's time per event
bounds the trainer), a store on a CPU the numpy one (there the dense arithmetic does, and memory
is what the CPU trainer's goals count). The build, once per hot set, is numpy either way.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from streamrec.foundation import splitmix64

_EMPTY = -1


class HotIndex:
    """``find(codes, ids)``: each id's arena slot, -1 where ``(table code, id)`` is not hot."""

    def __init__(self, salts: Sequence[int], codes: np.ndarray, ids: np.ndarray, slots: np.ndarray,
                 compiled: bool = False):
        """``salts[c]``: table ``c``'s 64-bit salt; ``codes``, ``ids``, ``slots``: one entry per hot row
        (``(code, id)`` unique); ``compiled``: probe with the numba kernel (module doc)."""
        self.compiled = bool(compiled)
        self.salts = np.asarray([s & (2**64 - 1) for s in salts] or [0], dtype=np.uint64)
        n = len(ids)
        size = 1 << max(4, int(2 * max(1, n) - 1).bit_length())  # a power of two >= 2n: load <= 1/2
        self.mask = np.uint64(size - 1)
        self.ids = np.zeros(size, np.int64)
        self.codes = np.full(size, _EMPTY, np.int16)
        self.slots = np.zeros(size, np.int64)
        self._insert(np.asarray(codes, np.int16), np.asarray(ids, np.int64), np.asarray(slots, np.int64))
        self.rows = n

    def _home(self, codes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Each key's home cell (the kernel's ``_home``, vectorised)."""
        h = splitmix64(ids.view(np.uint64) ^ self.salts[codes])
        h &= self.mask
        return h.view(np.int64)

    def _insert(self, codes: np.ndarray, ids: np.ndarray, slots: np.ndarray) -> None:
        m = int(self.mask)
        pos = self._home(codes, ids)
        order = np.arange(len(ids))
        while len(order):
            # several keys may probe the same free cell this round: each writes its mark there and the
            # one whose mark stays takes the cell; the others probe on
            fi = np.flatnonzero(self.codes[pos] == _EMPTY)
            self.slots[pos[fi]] = order[fi]
            won = fi[self.slots[pos[fi]] == order[fi]]
            self.ids[pos[won]] = ids[won]
            self.codes[pos[won]] = codes[won]
            self.slots[pos[won]] = slots[won]
            lose = np.ones(len(order), bool)
            lose[won] = False
            codes, ids, slots, order, pos = codes[lose], ids[lose], slots[lose], order[lose], (pos[lose] + 1) & m

    def find(self, codes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Arena slot of each ``(codes[i], ids[i])``, -1 where it is not hot."""
        out = np.full(len(ids), -1, np.int64)
        if not (len(ids) and self.rows):
            return out
        codes, ids = np.asarray(codes, np.int16), np.ascontiguousarray(ids, np.int64)
        if self.compiled:
            from .hot_index_kernel import find

            find(self.salts, self.mask, self.ids, self.codes, self.slots, codes, ids, out)
            return out
        m = int(self.mask)
        pos = self._home(codes, ids)
        at = np.arange(len(ids))
        while len(at):  # one probe round over the ids not resolved yet
            cc = self.codes[pos]
            hit = (cc == codes) & (self.ids[pos] == ids)
            out[at[hit]] = self.slots[pos[hit]]
            go = ~hit & (cc != _EMPTY)
            at, ids, codes, pos = at[go], ids[go], codes[go], (pos[go] + 1) & m
        return out

    def nbytes(self) -> int:
        return self.ids.nbytes + self.codes.nbytes + self.slots.nbytes


def index_of(tables: Sequence, arenas: dict, compiled: bool = False) -> HotIndex:
    """The index of ``tables``' hot rows (``Table``s, coded by their order) into their width's arena."""
    tables = list(tables)
    codes, ids, slots = [], [], []
    for c, t in enumerate(tables):
        h = t.hot
        codes.append(np.full(len(h), c, np.int16))
        ids.append(h.ids)
        slots.append(h.slot + arenas[t.dim].base[t.name])
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
    return HotIndex([t.salt for t in tables], cat(codes, np.int16), cat(ids, np.int64), cat(slots, np.int64),
                    compiled)
