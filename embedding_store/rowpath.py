"""The path of cold rows (rows not in the hot tier): host cache, prefetch buffers, cold tier.

Reads look in the host cache first, then in the table's prefetch buffers, then in the
cold tier; a row never stored reads as its deterministic init record. Writes go into
the cache as dirty rows when it is on, else straight to the cold tier, and every write
is applied to the table's buffers too, so a buffer never serves a stale row.
The functions take the store whose state they read and change (``store_types.StoreParts``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from .buffers import RowBuffer
from .rows import gather, init_rows, scatter, unique_sorted
from .table import MAX_BUFFERS, Probe, Table

if TYPE_CHECKING:
    from .store_parts import StoreParts


def fetch(store: StoreParts, t: Table, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Current records of unique cold ``ids`` (buffers first, then the cold tier)."""
    n = len(ids)
    recs = np.zeros(n, dtype=t.dtype)
    found = np.zeros(n, dtype=bool)
    have = np.zeros(n, dtype=bool)
    for b in reversed(t.buffers):
        b.take(ids, recs, found, have)
    if not have.all():
        rest = ~have
        r, f = store.cold.get(t.tag, t.salt, ids[rest], t.dtype)
        scatter(recs, rest, r)
        found[rest] = f
    return recs, found


def cold_rows(store: StoreParts, t: Table, ids: np.ndarray, touch: bool, count: bool = True,
              known: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Current ``(records, stored, cache slots)`` of unique cold ``ids``: host cache, then
    buffers, then the cold tier. A row never stored reads as its init record (acc 0, ts 0,
    epoch 0). ``touch`` marks cache hits as just used; ``count`` counts them as lookups;
    ``known`` are the ids' cache slots when a probe already found them."""
    c = t.cache
    if c is None:
        recs, found = fetch(store, t, ids)
        slots = np.full(len(ids), -1, dtype=np.int64)
    else:
        slots = c.lookup(ids, count, known) if touch else c.find(ids) if known is None else known
        hit = slots >= 0
        if hit.all():
            return gather(c.rec, slots), c.stored[slots], slots
        recs = np.empty(len(ids), dtype=t.dtype)
        found = np.empty(len(ids), dtype=bool)
        if hit.any():
            scatter(recs, hit, gather(c.rec, slots[hit]))
            found[hit] = c.stored[slots[hit]]
        miss = ~hit
        r, f = fetch(store, t, ids[miss])
        scatter(recs, miss, r)
        found[miss] = f
    if not found.all():
        recs["w"][~found] = init_rows(t.salt, store.seed, ids[~found], t.dim, t.init_scale)
    return recs, found, slots


def store_cold(store: StoreParts, t: Table, ids: np.ndarray, new: np.ndarray, old: np.ndarray,
               found: np.ndarray, slots: np.ndarray) -> None:
    """New records for cold rows: into the cache (dirty) when it is on, else straight to the cold tier."""
    c = t.cache
    if c is None:
        write(store, t, ids, new, old, found)
        return
    hit = slots >= 0
    if hit.any():
        c.update(slots[hit], gather(new, hit))
    if not hit.all():
        miss = ~hit
        c.insert(ids[miss], gather(new, miss), np.ones(int(miss.sum()), dtype=bool), dirty=True)


def write(store: StoreParts, t: Table, ids: np.ndarray, new: np.ndarray | None, old: np.ndarray,
          old_found: np.ndarray) -> None:
    """One atomic cold-tier write (``new`` None: delete), mirrored into the table's buffers."""
    store.cold.write(t.tag, t.salt, ids, new, old, old_found)
    for b in t.buffers:
        b.on_write(ids, new)


def spiller(store: StoreParts, t: Table) -> Callable[[np.ndarray, np.ndarray], None]:
    """The host cache's write-back of table ``t``: per-row puts, mirrored into the buffers."""
    def spill(ids: np.ndarray, recs: np.ndarray) -> None:
        store.cold.put(t.tag, t.salt, ids, recs)
        for b in t.buffers:
            b.on_write(ids, recs)
    return spill


def flush_caches(store: StoreParts) -> int:
    """Write every dirty cached row back; returns how many."""
    return sum(t.cache.flush() for t in store.tables.values() if t.cache is not None)


def remember(t: Table, ids: np.ndarray, recs: np.ndarray, found: np.ndarray) -> None:
    """Keep rows just read for the ``apply_gradients`` that usually follows (a settled buffer)."""
    t.buffers = [b for b in t.buffers if b.future is not None][-(MAX_BUFFERS - 1):]
    t.buffers.append(RowBuffer(ids, recs=recs.copy(), found=found.copy()))


def new_records(store: StoreParts, t: Table, ids: np.ndarray) -> np.ndarray:
    """Init records of ``ids``, stamped now and with the current write epoch."""
    r = np.zeros(len(ids), dtype=t.dtype)
    r["w"] = init_rows(t.salt, store.seed, ids, t.dim, t.init_scale)
    r["ts"] = time.time()
    r["ep"] = store.write_epoch
    return r


def drain(store: StoreParts) -> None:
    """Finish background reads and forget the buffers (before scans and migrations)."""
    for t in store.tables.values():
        for b in t.buffers:
            b.settle()
        t.buffers = []


def settle_cold(store: StoreParts, tables: Iterable[Table]) -> None:
    """Make the cold tier the one place the cold rows of ``tables`` live: background reads finished and
    buffers forgotten, remembered probes dropped, and the tables' cached rows written back and forgotten.
    What a scan that deletes rows (expiry, eviction, ``delete_rows``) needs first."""
    drain(store)
    store.probes.clear()
    for t in tables:
        if t.cache is not None:
            t.cache.clear()


def prefetch(store: StoreParts, t: Table, ids: np.ndarray) -> None:
    """Start reading the cold rows of ``ids`` on the prefetch thread, for a later lookup/apply."""
    uniq = unique_sorted(ids)  # sorted first: the index searches below are fastest on sorted ids
    hslots = t.hot.find(uniq)
    cold = uniq[hslots < 0]
    if t.cache is not None and len(cold):
        cslots = t.cache.find(cold)
        # the usual next call is lookup(these unique ids): it reuses both probes
        store.probes.prefetch[t.name] = Probe(t.name, uniq, hslots, cslots, t.hot.gen, t.cache.gen)
        cold = cold[cslots < 0]  # cached rows need no read
    if len(cold) == 0:
        return
    fut = store.prefetch_pool.submit(store.cold.get, t.tag, t.salt, cold, t.dtype)
    t.buffers.append(RowBuffer(cold, future=fut))
    if len(t.buffers) > MAX_BUFFERS:
        t.buffers[0].settle()
        t.buffers = t.buffers[-MAX_BUFFERS:]
