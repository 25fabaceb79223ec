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

from streamrec.foundation import splitmix64

from .store_types import UNADMITTED_ID

if TYPE_CHECKING:  # annotations only: the table and torch load after this module
    import torch

    from .store_types import StoreParts
    from .table import Table

__all__ = ["AdmissionCounter", "UNADMITTED_ID"]

DEPTH = 4
_MULT = tuple(np.uint64(m) for m in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93))


class AdmissionCounter:
    """Occurrences per id of one table in training, approximately, and the admission rule over them."""

    def __init__(self, min_count: int, counter_mb: float, shared: bool):
        if not 1 <= int(min_count) <= 255:  # 1: every id is admitted, the counts feed LFU eviction only
            raise ValueError(f"admit_min_count must be in 1..255 for a counter, got {min_count}")
        self.min_count = int(min_count)
        self.shared = bool(shared)
        cells = max(1 << 10, int(counter_mb * (1 << 20)) // DEPTH)
        bits = cells.bit_length() - 1  # a power of two at most counter_mb
        self.shift = np.uint64(64 - bits)
        self.table = np.zeros((DEPTH, 1 << bits), dtype=np.uint8)
        self.refused = 0  # ids (once per step they appeared in) that read the unadmitted value
        self.admitted = 0  # ids admitted by their count (their first step on their own row)
        self._memo: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # last lookup: ids, admitted, counts
        self._noted: tuple[np.ndarray, np.ndarray] | None = None  # the coming step's (ids, occurrences)

    def _cells(self, ids: np.ndarray) -> list[np.ndarray]:
        h = splitmix64(np.ascontiguousarray(ids, dtype=np.int64))
        with np.errstate(over="ignore"):
            return [((h * m) >> self.shift).astype(np.intp) for m in _MULT]

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Occurrences of each id counted so far (an upper bound), as int."""
        if not len(ids):
            return np.zeros(0, dtype=np.int64)
        cells = self._cells(ids)
        out = self.table[0][cells[0]].astype(np.int64)
        for row, c in zip(self.table[1:], cells[1:]):
            np.minimum(out, row[c], out=out)
        return out

    def admitted_mask(self, ids: np.ndarray, counts: np.ndarray | int = 0) -> np.ndarray:
        """Which ids have their own row once ``counts`` more occurrences (a step about to be counted) are
        added. The sentinel id is always its own row."""
        ok = self.estimate(ids) + counts >= self.min_count
        ok |= ids == UNADMITTED_ID
        return ok

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> None:
        """Count ``counts`` occurrences of each of the unique ``ids`` (conservative update: only the cells at
        the id's current minimum grow, which keeps collisions from inflating other ids' counts)."""
        if not len(ids):
            return
        cells = self._cells(ids)
        new = np.minimum(self.estimate(ids) + counts, 255).astype(np.uint8)
        for row, c in zip(self.table, cells):
            np.maximum.at(row, c, new)

    def note(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """How often each of the unique ``ids`` occurs in the coming training step."""
        self._noted = (np.asarray(ids, dtype=np.int64), np.asarray(counts, dtype=np.int64))

    def _counts(self, ids: np.ndarray) -> np.ndarray:
        noted = self._noted
        if noted is not None and np.array_equal(noted[0], ids):
            return noted[1]
        return np.ones(len(ids), dtype=np.int64)

    def mark(self, ids: np.ndarray) -> None:
        """Count ``ids`` as admitted (their rows exist)."""
        if not len(ids):
            return
        for row, c in zip(self.table, self._cells(ids)):
            np.maximum.at(row, c, np.uint8(self.min_count))

    # -- one training step: lookup, then apply_gradients ----------------------------------------
    def decide(self, ids: np.ndarray) -> np.ndarray:
        """The admitted mask of a training lookup of unique ``ids``, remembered for the apply that follows
        (the same ids get the same decision even if other steps were counted in between)."""
        counts = self._counts(ids)
        ok = self.admitted_mask(ids, counts)
        self._memo = (ids.copy(), ok, counts)
        self.refused += int(len(ok) - np.count_nonzero(ok))
        return ok

    def decided(self, ids: np.ndarray) -> np.ndarray:
        """The mask :meth:`decide` gave these ids, or a fresh decision when the last lookup was of other ids;
        then counts the step."""
        memo, self._memo = self._memo, None
        if memo is not None and np.array_equal(memo[0], ids):
            ok, counts = memo[1], memo[2]
        else:
            counts = self._counts(ids)
            ok = self.admitted_mask(ids, counts)
        self._noted = None
        self.admitted += int(np.count_nonzero(ok & (self.estimate(ids) < self.min_count)))
        self.add(ids, counts)
        return ok

    def nbytes(self) -> int:
        return int(self.table.nbytes)


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

