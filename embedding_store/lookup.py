"""The store's lookup path: a batch of ids to rows, hot rows from the device tier and cold rows through
the host cache, prefetch buffers and cold tier (``rowpath.py``), remembering where each row was found
for the ``apply_gradients`` that usually follows (``table.Probe``).
The function takes the store whose rows it reads (``store_types.StoreParts``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import rowpath
from .rows import gather
from .table import Probe

if TYPE_CHECKING:
    from .store_parts import StoreParts


def rows(store: StoreParts, table: str, ids, remember: bool, host: bool = False) -> torch.Tensor:
    """Rows of ``ids`` (any order, repeats allowed) as ``[n, dim]`` float32: hot rows from the device tier,
    cold ones through ``rowpath.cold_rows``; on the host with ``host``, else on the store's device.
    ``remember``: a training lookup (``EmbeddingStore.lookup``): cold rows join the host cache (its admission
    counts them) and the probe is kept for the ``apply_gradients`` that follows; otherwise a ``peek``."""
    t = store.table(table)
    dev = torch.device("cpu") if host else store.device
    ids = t.checked_ids(ids)
    n = len(ids)
    pre = store.probes.prefetch.pop(t.name, None)
    known = None
    if pre is not None and pre.valid_for(t, ids):
        slots, known = pre.hot, pre.cache  # prefetch(ids) already probed both indexes for these ids
    else:
        slots = t.hot.find(ids)
    is_hot = slots >= 0
    nh = int(is_hot.sum())
    store.hot_hits += nh
    store.cold_hits += n - nh
    store.probes.lookup.pop(t.name, None)
    if nh == n:
        return t.hot.w[torch.from_numpy(slots).to(store.device)].to(dev)
    cold_pos = np.flatnonzero(~is_hot)
    cids = ids[cold_pos]
    if len(cids) < 2 or bool(np.all(cids[1:] > cids[:-1])):  # already sorted unique (the trainer's
        uniq, inv = cids, np.arange(len(cids))                  # usual call): skip np.unique
    else:
        uniq, inv = np.unique(cids, return_inverse=True)
    recs, found, slots_c = rowpath.cold_rows(store, t, uniq, touch=remember, known=known)
    if remember:
        c = t.cache
        if c is not None:
            c.record(uniq)  # frequency admission counts every cold lookup
            miss = slots_c < 0
            refused, out_recs, out_found = False, None, None
            if miss.any():
                slots_c = slots_c.copy()
                slots_c[miss] = c.insert(uniq[miss], gather(recs, miss), found[miss], dirty=False)
                hp = np.flatnonzero(~miss)  # an eviction (tiny cache) may have taken a row just hit
                hs = slots_c[hp]
                lost = hp[~c.used[hs] | (c.sid[hs] != uniq[hp])]
                slots_c[lost] = -1
                out = miss & (slots_c < 0)  # refused by admission: kept for the apply_gradients that follows
                if out.any():
                    out_recs, out_found = recs[out], found[out]
                    rowpath.remember(t, uniq[out], out_recs, out_found)
                # admission decides row by row only for a batch that fits the cache (a bigger one is cut)
                refused = c.freq is not None and int(np.count_nonzero(miss)) <= c.capacity and not len(lost)
            if uniq is cids:  # the usual call: remember where this batch's rows are for apply_gradients
                # ids.copy(): the caller may refill its array
                store.probes.lookup[t.name] = Probe(t.name, ids.copy(), slots, slots_c, t.hot.gen, c.gen, refused,
                                            out_recs, out_found)
        else:
            rowpath.remember(t, uniq, recs, found)
    cold_rows = torch.from_numpy(np.ascontiguousarray(recs["w"][inv.reshape(-1)]))
    if nh == 0:
        return cold_rows.to(dev)
    out = torch.empty((n, t.dim), dtype=torch.float32, device=dev)
    hot_pos = np.flatnonzero(is_hot)
    out[torch.from_numpy(hot_pos).to(dev)] = t.hot.w[torch.from_numpy(slots[hot_pos]).to(store.device)].to(dev)
    out[torch.from_numpy(cold_pos).to(dev)] = cold_rows.to(dev)
    return out
