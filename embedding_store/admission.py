"""Admission by frequency: an id gets its own row once it has been seen ``admit_min_count`` times.

Why: in a Zipf stream most ids appear once or twice and never again; a row for each of them costs
RocksDB space, snapshot bytes and serving memory and learns nothing. Until an id is admitted it reads
and trains its table's shared row (stored under ``UNADMITTED_ID``, ``store.unadmitted = "shared"``) or
reads zeros and takes no gradient (``"zero"``); nothing is written under its own id.

Counting: a count-min sketch per table (``DEPTH`` rows of saturating uint8 counters, conservative
update, no decay) of the occurrences of each id in the training steps (``note_occurrences`` tells the
store how often each id of the coming step occurs in it; a step whose occurrences were not noted counts
each id once). Estimates only err upwards (collisions), so an id is never admitted later than its true
count says, and a few are admitted early. A step's own occurrences count for its decision: the step in
which an id reaches its ``admit_min_count``-th occurrence is its first on its own row, so an id seen
many times in its first step (a user's burst of events) is admitted at once.

Determinism: the counters are the store's state, written into every checkpoint and at ``close`` and
read back with it, so a replay from a checkpoint takes the same decisions. In a trainer group the
rank that owns an id's row counts it, with the occurrences every rank sends along with its ids, so the
counts are the ones a single trainer keeps (up to collisions, which only get fewer with more ranks).
Every path that creates a row outside training (hot-set promotion, ``upsert_rows``, ``import_records``)
marks its ids admitted, so a stored row is never read as unadmitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np


from .store_types import UNADMITTED_ID

if TYPE_CHECKING:  # annotations only: the table and torch load after this module
    import torch

    from .store_parts import StoreParts
    from .table import Table

from .admission_counter import AdmissionCounter

__all__ = ["AdmissionCounter", "UNADMITTED_ID"]

def note_occurrences(store: StoreParts, table: str, ids: np.ndarray, counts: np.ndarray) -> None:
    """Tell ``store`` how often each of the unique ``ids`` of ``table`` occurs in the training step whose
    ``lookup`` comes next (admission counts occurrences, not steps); nothing when the table admits every id."""
    t = store.tables.get(table)
    if t is not None and t.admission is not None:
        t.admission.note(ids, counts)


def configure(tables, min_count: int, unadmitted: str, counter_mb: float, max_rows: int, eviction: str) -> bool:
    """Give each table its cap and, when admission or LFU eviction needs them, its counters; True when it did
    (the caller then loads the saved counts)."""
    counting = int(min_count) >= 2 or (int(max_rows) > 0 and eviction == "lfu")
    for t in tables:
        t.max_rows = max(0, int(max_rows))
        if counting:
            t.admission = AdmissionCounter(max(1, int(min_count)), counter_mb, unadmitted == "shared")
    return counting


def _unique(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(sorted unique ids, inverse) of ``ids``; inverse None when ``ids`` already are sorted and unique."""
    if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, None
    u, inv = np.unique(ids, return_inverse=True)
    return u, inv.reshape(-1)


def lookup(t: Table, ids: np.ndarray, dev: torch.device, read: Callable[[np.ndarray], torch.Tensor]) -> torch.Tensor:
    """``EmbeddingStore.lookup`` of a table with admission: admitted ids read their rows, the others the
    unadmitted value (the shared row, or zeros), on device ``dev``. ``read(ids)`` is the plain training
    lookup of the table's rows (on ``dev``)."""
    import torch

    c = t.admission
    uniq, inv = _unique(ids)
    ok = c.decide(uniq) | t.hot.mask(uniq)
    if ok.all():
        rows = read(uniq)
    elif c.shared:
        m_uniq, m_inv = np.unique(np.where(ok, uniq, UNADMITTED_ID), return_inverse=True)
        rows = read(m_uniq)[torch.from_numpy(m_inv.reshape(-1)).to(dev)]
    else:
        rows = torch.zeros((len(uniq), t.dim), dtype=torch.float32, device=dev)
        keep = np.flatnonzero(ok)
        if len(keep):
            rows[torch.from_numpy(keep).to(dev)] = read(uniq[keep])
    return rows if inv is None else rows[torch.from_numpy(inv).to(dev)]


def peek(store: StoreParts, t: Table, ids: np.ndarray) -> torch.Tensor:
    """``EmbeddingStore.peek`` of a table with admission (see :func:`peek_with_admission`)."""
    return peek_with_admission(store, t.name, ids, t.admission.shared)


def peek_with_admission(store: StoreParts, table: str, ids: np.ndarray, shared: bool) -> torch.Tensor:
    """Rows of ``ids`` (any order, repeats allowed) as a trainer that admits ids by frequency reads them: held
    rows as stored, every other id the unadmitted value, the shared row (``UNADMITTED_ID``'s, at its init while
    it is not stored) when ``shared``, else zeros. Serving reads a version's store with it, so an id the version
    holds no row for scores as it did in training."""
    import torch

    uniq, inv = _unique(np.asarray(ids, dtype=np.int64))
    rows, held = store.peek_held(table, uniq)
    if not held.all():
        if shared:
            fill = store.peek_held(table, np.array([UNADMITTED_ID], dtype=np.int64))[0][0]
        else:
            fill = torch.zeros(rows.shape[1], dtype=rows.dtype, device=rows.device)
        rows[torch.from_numpy(np.flatnonzero(~held)).to(rows.device)] = fill
    return rows if inv is None else rows[torch.from_numpy(inv).to(rows.device)]


def apply_gradients(t: Table, ids: np.ndarray, grads, apply: Callable[[np.ndarray, torch.Tensor], None]) -> np.ndarray:
    """``EmbeddingStore.apply_gradients`` of a table with admission: the admitted ids' gradients go to their
    rows; the others' are summed into the shared row (or dropped, ``zero``). ``apply(ids, grads)`` is the
    plain row-wise update (which also refuses bad arguments). Counts the step; returns the ids whose rows
    it wrote (the shared row's ``UNADMITTED_ID`` among them when it took a gradient)."""
    import torch

    ids = t.checked_unique_ids(ids)
    if isinstance(grads, np.ndarray):
        grads = torch.from_numpy(grads)
    if not isinstance(grads, torch.Tensor) or tuple(grads.shape) != (len(ids), t.dim):
        apply(ids, grads)  # refuses them with the usual message
        return ids
    c = t.admission
    ok = c.decided(ids) | t.hot.mask(ids)
    if ok.all():
        apply(ids, grads)
        return ids
    if c.shared:
        m_uniq, m_inv = np.unique(np.where(ok, ids, UNADMITTED_ID), return_inverse=True)
        g = torch.zeros((len(m_uniq), t.dim), dtype=grads.dtype, device=grads.device)
        g.index_add_(0, torch.from_numpy(m_inv.reshape(-1)).to(grads.device), grads)
        apply(m_uniq, g)
        return m_uniq
    keep = np.flatnonzero(ok)
    if len(keep):
        apply(ids[keep], grads[torch.from_numpy(keep).to(grads.device)])
    return ids[keep]

