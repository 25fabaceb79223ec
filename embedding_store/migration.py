"""Moving rows between the hot tier and the tiers below it.

``set_hot`` applies a new hot set: demoted rows (with their Adagrad state) are written
to the cold tier, promoted rows are taken out of the host cache or read from the cold
tier (or initialised), so every row keeps exactly one owner and no update is lost.
``write_back_hot`` refreshes the cold tier's backup copy of changed hot rows (at
checkpoints and on close).
The functions take the store whose tiers they change (``store_types.StoreParts``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import rowpath
from .cache import SPILL_CHUNK
from .errors import StoreError
from .table import Table

if TYPE_CHECKING:
    from .store_parts import StoreParts


def set_hot(store: StoreParts, hot: dict[str, np.ndarray]) -> dict:
    """Make ``hot`` the complete hot set (a table not named has no hot rows); returns counts.

    All reads and writes happen here, in the caller's thread, after pending prefetches
    have settled.
    """
    store.check_writable()
    want = {}
    for name, ids in hot.items():
        t = store.table(name)
        want[name] = np.unique(t.checked_ids(ids))
    total = sum(len(v) for v in want.values())
    if total > store.hot_capacity_rows:
        raise StoreError(f"hot set of {total} rows exceeds hot_capacity_rows={store.hot_capacity_rows}")
    if store.hot_capacity_bytes > 0:  # rows of different tables cost their own width
        need = store.hot_bytes_of({n: len(v) for n, v in want.items()})
        if need > store.hot_capacity_bytes:
            raise StoreError(f"hot set of {total} rows takes {need} device bytes, more than "
                             f"hot_capacity_bytes={store.hot_capacity_bytes}")
    rowpath.drain(store)
    store.probes.clear()
    for name, ids in want.items():  # a promoted row exists from now on: it counts as admitted
        t = store.tables[name]
        if t.admission is not None:
            t.admission.mark(ids)
    stats = {"promoted": 0, "demoted": 0, "kept": 0, "created": 0, "hot_rows": total}
    t0 = time.perf_counter()
    for name, t in store.tables.items():
        new_ids = want.get(name, np.empty(0, dtype=np.int64))
        h = t.hot
        cur = h.slot_ids()
        stay = np.isin(cur, new_ids)
        # demote: write rows leaving the hot tier back to the cold tier
        dem_slots = np.flatnonzero(~stay)
        if len(dem_slots):
            spill_hot(store, t, cur[dem_slots], dem_slots)
        # promote: read rows entering the hot tier
        prom = new_ids[~np.isin(new_ids, cur)]
        recs, found = store.cold.get(t.tag, t.salt, prom, t.dtype)
        dirty = ~found
        if t.cache is not None and len(prom):  # cached rows move to the hot tier with their state
            hit, crec, cstored, cdirty = t.cache.take(prom)
            recs[hit], found[hit], dirty[hit] = crec, cstored, cdirty | ~cstored
        if not found.all():
            recs[~found] = rowpath.new_records(store, t, prom[~found])
        keep_slots = np.flatnonzero(stay)
        kst = torch.from_numpy(keep_slots).to(store.device)
        w = torch.cat([h.w[kst], torch.from_numpy(recs["w"].copy()).to(store.device)])
        acc = torch.cat([h.acc[kst], torch.from_numpy(recs["acc"].copy()).to(store.device)])
        h.rebuild(np.concatenate([cur[keep_slots], prom]), w, acc,
                  np.concatenate([h.ep[keep_slots], recs["ep"].astype(np.int64)]),
                  np.concatenate([h.ts[keep_slots], recs["ts"]]),
                  np.concatenate([h.dirty[keep_slots], dirty]))
        stats["promoted"] += len(prom)
        stats["demoted"] += len(dem_slots)
        stats["kept"] += len(keep_slots)
        stats["created"] += int((~found).sum())
    store.lay_out_hot()  # the fused step reads every table's rows in its width's arena, found by the hot index
    stats["seconds"] = time.perf_counter() - t0
    return stats


def spill_hot(store: StoreParts, t: Table, ids: np.ndarray, slots: np.ndarray) -> None:
    """Write hot ``slots`` (holding ``ids``) to the cold tier with their Adagrad state and times."""
    h = t.hot
    old, found = store.cold.get(t.tag, t.salt, ids, t.dtype)
    rec = np.zeros(len(ids), dtype=t.dtype)
    st = torch.from_numpy(slots).to(store.device)
    rec["w"] = h.w[st].cpu().numpy()
    rec["acc"] = h.acc[st].cpu().numpy()
    rec["ts"] = h.ts[slots]
    rec["ep"] = h.ep[slots]
    store.cold.write(t.tag, t.salt, ids, rec, old, found)


def write_back_hot(store: StoreParts) -> int:
    """Refresh the cold tier's backup copy of hot rows changed since the last write-back."""
    n = 0
    for t in store.tables.values():
        h = t.hot
        dirty = np.flatnonzero(h.dirty)
        if not len(dirty):
            continue
        sid = h.slot_ids()
        for lo in range(0, len(dirty), SPILL_CHUNK):  # chunks bound the transient memory
            d = dirty[lo:lo + SPILL_CHUNK]
            spill_hot(store, t, sid[d], d)
            h.dirty[d] = False
        n += len(dirty)
    return n
