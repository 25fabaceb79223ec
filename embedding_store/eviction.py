"""A cap on each table's rows: ``store.max_rows``, enforced by sweeps that delete the rows least worth keeping.

A table may grow to ``max_rows * (1 + evict_slack)`` rows (its stored rows, hot ones included) between
two sweeps; a sweep cuts it back to ``max_rows``. Hot rows and the shared unadmitted row are never
evicted (they still count). Which rows go first (``store.eviction``): ``lru`` the least recently written;
``lfu`` the fewest training steps (the admission counters' estimate), decayed by half for every
``lfu_half_life_s`` since the row's last write, so that a once-popular row that the stream left behind
goes before a row of moderate, current use. Ties go to the smaller id, so a sweep is a function of the
rows' records and counts. A deleted row reads as its deterministic init again (or as unadmitted, when
admission is on and its count no longer admits it: it is re-admitted at its next step, since counts
never fall).

Cached rows are written back first (the cold tier decides, as for ``expire``). Each sweep reads the
whole cold tier once (a RocksDB scan); with the slack, the scans cost a bounded amount per created row.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import rowpath
from .export import scan_cold
from .store_types import UNADMITTED_ID

if TYPE_CHECKING:
    from .store_parts import StoreParts


def over_cap(store: StoreParts) -> list[str]:
    """Tables whose row count may have passed ``max_rows * (1 + slack)`` since their last sweep (a table never
    swept is counted by its first sweep)."""
    out = []
    for t in store.tables.values():
        if t.max_rows > 0 and (t.rows_at_sweep is None
                               or t.rows_at_sweep + t.created > t.max_rows * (1.0 + store.evict_slack)):
            out.append(t.name)
    return out


def evict(store: StoreParts, tables: list[str] | None = None,
          clock: Callable[[], float] = time.time) -> dict[str, np.ndarray]:
    """Sweep ``tables`` (default: those :func:`over_cap` names) down to ``max_rows``; returns the deleted ids
    per table (sorted)."""
    store.check_writable()
    names = over_cap(store) if tables is None else [n for n in tables if store.tables[n].max_rows > 0]
    if not names:
        return {}
    rowpath.settle_cold(store, [store.tables[n] for n in names])
    ids_of: dict[str, list] = {n: [] for n in names}
    ts_of: dict[str, list] = {n: [] for n in names}
    for t, ids, recs in scan_cold(store):
        if t.name in ids_of:
            cold = ~t.hot.mask(ids)
            ids_of[t.name].append(ids[cold])
            ts_of[t.name].append(recs["ts"][cold])
    now = clock()
    out: dict[str, np.ndarray] = {}
    for n in names:
        t = store.tables[n]
        ids = np.concatenate(ids_of[n]) if ids_of[n] else np.zeros(0, np.int64)
        ts = np.concatenate(ts_of[n]) if ts_of[n] else np.zeros(0, np.float64)
        total = len(ids) + len(t.hot)
        excess = total - t.max_rows
        t.created = 0
        if excess <= 0:
            t.rows_at_sweep = total
            continue
        cand = ids != UNADMITTED_ID
        cids, cts = ids[cand], ts[cand]
        if store.eviction == "lru" or t.admission is None:
            score = cts.astype(np.float64)
        else:
            age = np.maximum(0.0, now - cts.astype(np.float64))
            score = t.admission.estimate(cids).astype(np.float64) * np.exp2(-age / store.lfu_half_life_s)
        order = np.lexsort((cids, score))[:excess]  # lowest score first, then the smaller id
        gone = np.sort(cids[order])
        if len(gone):
            store.delete_rows(n, gone)
        t.rows_at_sweep = total - len(gone)
        t.evicted += len(gone)
        out[n] = gone
    return out
