"""The row optimizer: row-wise Adagrad applied where each row lives.

A hot row is updated in place in the device tier; a cold row is read through the
cold-row path (``rowpath.py``), updated on the host and written back through it. Both
use ``adagrad.py``'s arithmetic, so a row's result does not depend on its tier.
The functions take the store whose rows they update (``store_types.StoreParts``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import admission, rowpath
from .adagrad import adagrad_rows, adagrad_rows_np
from .errors import StoreError
from .rows import gather, scatter

if TYPE_CHECKING:
    from .store_parts import StoreParts
    from .table import Table


def apply_gradients(store: StoreParts, table: str, ids, grads) -> np.ndarray | None:
    """Row-wise Adagrad on rows ``ids`` (unique) with ``grads [n, dim]`` float32; nothing is
    applied when a gradient is not finite. With admission (``admission.py``), an id not admitted yet
    updates its table's shared row (or nothing) instead of its own, and the ids whose rows were written
    are returned (None without admission: ``ids``)."""
    t = store.table(table)
    if t.admission is None:
        apply_rows(store, table, ids, grads)
        return None
    return admission.apply_gradients(t, ids, grads, lambda i, g: apply_rows(store, table, i, g))


def apply_rows(store: StoreParts, table: str, ids, grads) -> None:
    """Row-wise Adagrad on rows ``ids`` themselves (see :func:`apply_gradients`)."""
    store.check_writable()
    t = store.table(table)
    ids = t.checked_unique_ids(ids)
    if isinstance(grads, np.ndarray):
        grads = torch.from_numpy(grads)
    if not isinstance(grads, torch.Tensor):
        raise StoreError(f"{table}: grads must be a torch.Tensor, got {type(grads).__name__}")
    if grads.dtype != torch.float32:
        raise StoreError(f"{table}: grads must be float32, got {grads.dtype}")
    if tuple(grads.shape) != (len(ids), t.dim):
        raise StoreError(f"{table}: grads must have shape ({len(ids)}, {t.dim}), got {tuple(grads.shape)}")
    if len(ids) == 0:
        return
    grads = grads.detach()
    # one host copy per table: the finite check and the cold rows' update read it, and on a GPU it is the
    # step's one wait for the device (a device-side check would be a second one)
    gnp = grads.numpy() if grads.device.type == "cpu" else grads.cpu().numpy()
    if not bool(np.isfinite(gnp).all()):
        raise StoreError(f"{table}: grads contain NaN or inf; nothing was applied")
    now = time.time()
    memo = store.probes.lookup.pop(t.name, None)
    cslots = None
    memo_ok = memo is not None and memo.valid_for(t, ids)
    if memo_ok:
        slots, cslots = memo.hot, memo.cache  # where lookup(ids) just found or put these rows
    else:
        slots = t.hot.find(ids)
    is_hot = slots >= 0
    if is_hot.any():
        _apply_hot(store, t, ids, slots, is_hot, grads, gnp, now)
    if is_hot.all():
        return
    cp = np.flatnonzero(~is_hot)
    cids = ids[cp]
    cached = cslots is not None and bool((cslots >= 0).all())
    # lookup(ids) just ran frequency admission for these rows: the ones it refused go straight back
    # to the cold tier, as a refused dirty row does, instead of through a second admission (which compares
    # the same counts against the next, no weaker, candidates), and their records come from the probe
    refused_out = not cached and memo_ok and memo.refused
    if cached:
        old, found = gather(t.cache.rec, cslots), t.cache.stored[cslots]
    elif refused_out:
        t.cache.lookup(cids, count=False, slots=cslots)  # the hits are used again, as cold_rows marks them
        hit = cslots >= 0
        old = np.empty(len(cids), dtype=t.dtype)
        found = np.empty(len(cids), dtype=bool)
        if hit.any():
            scatter(old, hit, gather(t.cache.rec, cslots[hit]))
            found[hit] = t.cache.stored[cslots[hit]]
        miss = ~hit
        scatter(old, miss, memo.refused_recs)
        found[miss] = memo.refused_found
    else:
        old, found, cslots = rowpath.cold_rows(store, t, cids, touch=True, count=False, known=cslots)
    made = len(found) - int(np.count_nonzero(found))
    store.created += made
    t.created += made
    g = gnp if len(cp) == len(ids) else gnp[cp]
    new = old if cached or refused_out else old.copy()  # old records are not needed again then
    new["w"], new["acc"] = adagrad_rows_np(old["w"], old["acc"], g, store.lr, store.eps)
    new["ts"] = now
    new["ep"] = store.write_epoch
    if cached:  # every row already has its cache slot (lookup put it there): update in place
        t.cache.update(cslots, new)
    elif refused_out:
        t.cache.update(cslots[hit], gather(new, hit))
        t.cache.write_back(cids[miss], gather(new, miss))
    else:
        rowpath.store_cold(store, t, cids, new, old, found, cslots)


def _apply_hot(store: StoreParts, t: Table, ids: np.ndarray, slots: np.ndarray, is_hot: np.ndarray,
               grads: torch.Tensor, gnp: np.ndarray, now: float) -> None:
    """The hot rows' part of a step: updated in place on the device (or queued for
    :func:`flush_hot_updates` inside ``EmbeddingStore.fused_hot_updates``)."""
    hp = np.flatnonzero(is_hot)
    s = slots[hp]
    every = len(hp) == len(ids)
    if store.device.type == "cpu":  # numpy: same IEEE ops, no per-op dispatch cost
        hw, ha = t.hot.w.numpy(), t.hot.acc.numpy()
        g = gnp if every else gnp[hp]
        hw[s], ha[s] = adagrad_rows_np(hw[s], ha[s], g, store.lr, store.eps)
    else:
        g = (grads if every else grads[torch.from_numpy(hp).to(grads.device)]).to(store.device)
        if store.hot_queue is not None:
            store.hot_queue.append((t, s, g))
        else:
            fused_hot_update([(t.hot.w, t.hot.acc, s, g)], store.lr, store.eps, store.device)
    t.hot.dirty[s] = True
    t.hot.ep[s] = store.write_epoch
    t.hot.ts[s] = now


def fused_hot_update(parts, lr: float, eps: float, device: torch.device) -> None:
    """Row-wise Adagrad on several tables' device rows with one set of kernels.

    ``parts``: ``(w [rows, dim], acc [rows], slots np.ndarray, grads [len(slots), dim])`` per table,
    slots unique within a table. The rows of every table of one width are gathered into one
    batch, updated by one :func:`adagrad_rows` call and scattered back. Adagrad is elementwise
    per row, so the result is bit-identical to one call per table; only the number of kernel
    launches changes (one batch instead of one per table), which is what bounds a GPU step.
    """
    by_dim: dict[int, list] = {}
    for part in parts:
        if len(part[2]):
            by_dim.setdefault(int(part[0].shape[1]), []).append(part)
    for group in by_dim.values():
        sizes = [len(s) for _, _, s, _ in group]
        slots = torch.split(torch.from_numpy(np.concatenate([s for _, _, s, _ in group])).to(device), sizes)
        w = torch.cat([w[st] for (w, _, _, _), st in zip(group, slots)])
        acc = torch.cat([a[st] for (_, a, _, _), st in zip(group, slots)])
        g = torch.cat([g for _, _, _, g in group])
        w_new, acc_new = adagrad_rows(w, acc, g, lr, eps)
        for (w_t, a_t, _, _), st, wn, an in zip(group, slots, torch.split(w_new, sizes), torch.split(acc_new, sizes)):
            w_t[st] = wn
            a_t[st] = an


def flush_hot_updates(store: StoreParts) -> None:
    """Apply the device-tier updates queued since ``fused_hot_updates`` began."""
    queue, store.hot_queue = store.hot_queue, None
    if queue:
        fused_hot_update([(t.hot.w, t.hot.acc, s, g) for t, s, g in queue], store.lr, store.eps, store.device)
