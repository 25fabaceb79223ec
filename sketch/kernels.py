"""Compiled (numba) per-id loops of the sketch update: numpy needs sorts for these.

Grouping equal ids in numpy costs two sorts per flush and the conservative
update a gather, a ``min`` and a ``maximum.at`` over ``depth x distinct`` cells;
together they bound the update's speed. Here one pass per field hashes
each ``(table, id)`` into its sketch key and sums its event's decay weight
into an open-addressing table (:class:`Accumulator`; a slot is prefetched a
few ids ahead, since rare ids miss cache), and a flush walks that table's distinct keys once, doing the
count-min update of each key's ``depth`` cells in place. Hashes are exactly
those of ``keys.make_keys`` and ``CountMinSketch`` (serialised sketches are
unchanged), and so is the conservative update of a flush (see ``_cms_apply``).

Compiled with ``cache=True`` (on-disk cache next to this file) and warmed by
:func:`warm` at first use, so a compile never lands in a timed update.
"""

from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_FIB = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of a key to its accumulator slot


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    """splitmix64 finaliser (compiled twin of ``streamrec.foundation.splitmix64``)."""
    z = x + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the CPU to load ``arr[idx]`` into cache (no fault, no effect on results)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, high locality, data
        return context.get_dummy_value()

    return sig, codegen


_AHEAD = 16  # ids between a slot's prefetch and its use: the table misses cache for the Zipf tail


class Accumulator:
    """Distinct ``(table, id)`` keys with their summed weights since the last flush.

    Open addressing with linear probing over ``2 * capacity`` slots (load <= 1/2).
    A slot is ``(key, weight)`` side by side (``kw``, one cache line for a hit;
    ``kwf`` is the same memory as float64), a negative weight marking it empty
    (weights are >= 0); table and id are written on insertion only. ``order``
    lists the used slots in insertion order so a flush touches only those.
    """

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = max(16, int(capacity))
        slots = 1 << (2 * self.capacity - 1).bit_length()
        self.shift = np.uint64(64 - (slots.bit_length() - 1))
        self.kw = np.zeros((slots, 2), np.uint64)
        self.kwf = self.kw.view(np.float64)
        self.kwf[:, 1] = -1.0
        self.ids = np.zeros(slots, np.int64)
        self.tables = np.zeros(slots, np.int16)
        self.order = np.zeros(self.capacity, np.int64)
        self.n = 0  # distinct keys held

    def add(self, table: int, salt: np.uint64, mix: bool, values: np.ndarray, offsets: np.ndarray,
            weights: np.ndarray, start: int = 0) -> int:
        """Sum ``weights[e]`` (>= 0) into the key of every id of row ``e`` (from row ``start``).

        ``values`` are ids (keyed as ``splitmix64(id ^ salt)``, as ``keys.make_keys``)
        or, with ``mix`` false, keys already. ``values`` and ``offsets`` int64,
        ``weights`` float64, all C-contiguous. Returns the row it stopped at:
        ``len(offsets) - 1`` when every row fit, less when the table filled
        (flush, then call again from there).
        """
        if len(weights) < len(offsets) - 1:
            raise ValueError(f"{len(offsets) - 1} rows but {len(weights)} weights")
        stop, self.n = _accumulate(self.kw, self.kwf, self.ids, self.tables, self.order, self.n, self.shift,
                                   np.int16(table), np.uint64(salt), mix, values, offsets, weights, start)
        if stop < 0:
            e = -1 - stop
            raise ValueError(f"bad offsets at row {e}: [{offsets[e]}, {offsets[e + 1]}) over {len(values)} ids")
        if stop == start and self.n == 0 and stop < len(offsets) - 1:
            raise ValueError(f"row {stop} has {offsets[stop + 1] - offsets[stop]} ids of one field, more than "
                             f"the sketch's accumulator holds ({self.capacity} distinct keys)")
        return stop

    def taken(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys, tables, ids, weights) held, in insertion order (copies)."""
        s = self.order[:self.n]
        return self.kw[s, 0], self.tables[s], self.ids[s], self.kwf[s, 1]


@njit(cache=True, nogil=True)
def _accumulate(kw, kwf, ids, tables, order, n, shift, table, salt, mix, values, offsets, weights, start):
    mask = len(kw) - 1
    cap = len(order)
    rows = len(offsets) - 1
    nv = len(values)
    for e in range(start, rows):
        a, b = offsets[e], offsets[e + 1]
        if a < 0 or b < a or b > len(values):  # malformed offsets: never read outside ``values``
            return -1 - e, n
        if n + (b - a) > cap:  # this row might not fit: hand back so the caller flushes
            return e, n
        we = weights[e]
        for j in range(a, b):
            if j + _AHEAD < nv:  # the slot of a later id: its cache miss overlaps this work
                kp = np.uint64(values[j + _AHEAD])
                if mix:
                    kp = _mix(kp ^ salt)
                _prefetch(kwf, np.intp((kp * _FIB) >> shift))
            v = values[j]
            k = np.uint64(v)
            if mix:
                k = _mix(k ^ salt)
            s = np.intp((k * _FIB) >> shift)
            while True:
                x = kwf[s, 1]
                if kw[s, 0] == k and x >= 0.0:
                    kwf[s, 1] = x + we
                    break
                if x < 0.0:
                    kw[s, 0] = k
                    kwf[s, 1] = we
                    ids[s] = v
                    tables[s] = table
                    order[n] = s
                    n += 1
                    break
                s = (s + 1) & mask
    return rows, n


@njit(cache=True, nogil=True, inline="always")
def _prefetch_cells(flat, h1, depth, width, mask):
    h2 = _mix(h1) | np.uint64(1)
    h = h1
    for r in range(depth):
        _prefetch(flat, r * width + np.intp(h & mask))
        h += h2


@njit(cache=True, nogil=True)
def _cms_apply(flat, depth, width, salt, conservative, kw, kwf, order, n, est):
    """Count-min update of each held key's cells; its estimate after the update goes to ``est``.

    ``flat`` is the ``depth x width`` counts, flattened (a view). Conservative:
    every key's target ``min + weight`` is taken from the cells as they were
    before the flush, then each cell is raised to the largest target among its
    keys. A key's cells all end >= its own target >= its true count (the
    guarantee), and keys of one flush do not stack on each other, which a
    one-key-at-a-time update over a pre-aggregated batch would do. Cells are
    prefetched a few keys ahead (the counts are bigger than L2). Empties the
    accumulator's slots; returns the total weight added.
    """
    mask = np.uint64(width - 1)
    total = 0.0
    hs = np.empty(n, np.uint64)  # each key's first row hash, in order
    ws = np.empty(n, np.float64)
    for i in range(n):  # gather the held keys (random slots) into sequential arrays
        if i + _AHEAD < n:
            _prefetch(kwf, order[i + _AHEAD])
        s = order[i]
        x = kwf[s, 1]
        kwf[s, 1] = -1.0
        total += x
        ws[i] = x
        hs[i] = _mix(kw[s, 0] ^ salt)
    ahead = _AHEAD // 2
    for i in range(n):
        if i + ahead < n:
            _prefetch_cells(flat, hs[i + ahead], depth, width, mask)
        h = hs[i]
        h2 = _mix(h) | np.uint64(1)
        if conservative:  # target: min + weight against the cells as they were before this flush
            m = np.inf
            for r in range(depth):
                m = min(m, flat[r * width + np.intp(h & mask)])  # branch-free: keeps the loads overlapping
                h += h2
            est[i] = m + ws[i]
        else:
            x = ws[i]
            for r in range(depth):
                flat[r * width + np.intp(h & mask)] += x
                h += h2
    for i in range(n):  # second pass, once every key of the flush is in
        if i + ahead < n:
            _prefetch_cells(flat, hs[i + ahead], depth, width, mask)
        h = hs[i]
        h2 = _mix(h) | np.uint64(1)
        if conservative:  # raise each cell to its key's target; keys sharing a cell: the largest target wins
            new = est[i]
            for r in range(depth):
                ci = r * width + np.intp(h & mask)
                flat[ci] = max(flat[ci], new)
                h += h2
        else:  # the estimate, with the whole flush counted
            m = np.inf
            for r in range(depth):
                m = min(m, flat[r * width + np.intp(h & mask)])
                h += h2
            est[i] = m
    return total


def cms_apply(counts: np.ndarray, salt: np.uint64, conservative: bool, acc: Accumulator) -> tuple[np.ndarray, float]:
    """Flush ``acc`` into ``counts``: (estimates in ``acc.order`` order, total weight). Empties ``acc``."""
    depth, width = counts.shape
    flat = counts.reshape(-1)
    if not np.shares_memory(flat, counts):
        raise ValueError("count-min counts must be one C-contiguous array")
    est = np.empty(acc.n, np.float64)
    total = _cms_apply(flat, depth, width, np.uint64(salt), conservative, acc.kw, acc.kwf, acc.order, acc.n, est)
    acc.n = 0
    return est, total


@njit(cache=True, nogil=True)
def cms_estimate(counts, salt, keys, out):
    """``out[i]`` = min over rows of key ``keys[i]``'s cells."""
    depth, width = counts.shape
    mask = np.uint64(width - 1)
    for i in range(len(keys)):
        h1 = _mix(keys[i] ^ salt)
        h2 = _mix(h1) | np.uint64(1)
        m = np.inf
        h = h1
        for r in range(depth):
            m = min(m, counts[r, np.intp(h & mask)])
            h += h2
        out[i] = m


@njit(cache=True, nogil=True)
def hh_offer(hk, ht, hi, he, keys, tables, ids, est, capacity):
    """Kept candidates ``(hk, ht, hi, he)`` updated with offered distinct keys, trimmed to the ``capacity`` largest.

    An offered key already kept takes its new estimate; a new one is appended.
    Membership goes through a hash index built for this call (no sort of either
    side). Returns new arrays (kept order, then newcomers in offer order).
    """
    n, m = len(hk), len(keys)
    tot = n + m
    ok = np.empty(tot, np.uint64)
    ot = np.empty(tot, np.int16)
    oi = np.empty(tot, np.int64)
    oe = np.empty(tot, np.float64)
    ok[:n] = hk
    ot[:n] = ht
    oi[:n] = hi
    oe[:n] = he
    bits = 4
    while (1 << bits) < 2 * tot:
        bits += 1
    slots = 1 << bits
    mask = slots - 1
    shift = np.uint64(64 - bits)
    index = np.full(slots, -1, np.int64)
    for i in range(n):
        s = np.intp((hk[i] * _FIB) >> shift)
        while index[s] >= 0:
            s = (s + 1) & mask
        index[s] = i
    o = n
    for j in range(m):
        k = keys[j]
        s = np.intp((k * _FIB) >> shift)
        while True:
            p = index[s]
            if p < 0:
                index[s] = o
                ok[o] = k
                ot[o] = tables[j]
                oi[o] = ids[j]
                oe[o] = est[j]
                o += 1
                break
            if ok[p] == k:
                oe[p] = est[j]
                break
            s = (s + 1) & mask
    if o <= capacity:
        return ok[:o], ot[:o], oi[:o], oe[:o]
    cut = o - capacity
    kth = np.partition(oe[:o].copy(), cut)[cut]  # the capacity-th largest estimate
    ties = capacity
    for i in range(o):
        if oe[i] > kth:
            ties -= 1
    w = 0
    for i in range(o):
        x = oe[i]
        if x > kth or (x == kth and ties > 0):
            if x == kth:
                ties -= 1
            ok[w], ot[w], oi[w], oe[w] = ok[i], ot[i], oi[i], x
            w += 1
    return ok[:w], ot[:w], oi[:w], oe[:w]


_warm_s: float | None = None


def warm() -> float:
    """Compile (or load from the on-disk cache) every kernel once; returns the seconds the first call took."""
    global _warm_s
    if _warm_s is None:
        t = time.perf_counter()
        acc = Accumulator(16)
        ids, offsets, one = np.arange(2, dtype=np.int64), np.arange(3, dtype=np.int64), np.ones(2, np.float64)
        counts = np.zeros((2, 8), np.float64)
        for cons in (True, False):
            acc.add(0, np.uint64(1), cons, ids, offsets, one)
            cms_apply(counts, np.uint64(3), cons, acc)
        cms_estimate(counts, np.uint64(3), np.arange(2, dtype=np.uint64), np.empty(2, np.float64))
        e = np.zeros(0)
        hh_offer(np.zeros(0, np.uint64), np.zeros(0, np.int16), np.zeros(0, np.int64), e,
                 np.arange(3, dtype=np.uint64), np.zeros(3, np.int16), np.arange(3, dtype=np.int64), np.ones(3), 2)
        _warm_s = time.perf_counter() - t
    return _warm_s
