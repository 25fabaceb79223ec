"""Which embedding rows changed since a push: the rows of a delta between checkpoints.

Why: serving gets a delta every ``serving.push_every_s`` (about a second), far more often than a
durable checkpoint is written. The store can list the rows changed after a *checkpoint* epoch, but
only with a scan of all of RocksDB; once a second that would cost more than the training. So the
trainer keeps its own journal: :class:`ChangeJournal` stands in front of the store, passes every
call through, and notes the ids of each write (``apply_gradients``, ``upsert_rows``). The fused step
updates the device tier's hot rows in place and only stamps them (``mark_hot_written``: each hot row's
``ts``), so ``cut()`` first notes every hot row stamped since the previous cut. ``cut()`` then closes the
current segment and returns its mark; ``rows_since(m)``
reads the current vectors of the ids written after mark ``m`` (a read that changes nothing: no cache
recency, no counters). In a trainer group every rank's store gets its own journal (a rank's store
is written only for the rows it owns), and the ranks cut in the same collective, so their marks agree.

Rows deleted by the store's eviction sweep (:meth:`ChangeJournal.evict`) are journaled the same way, so
that a delta tells serving to drop them (``deleted_since``); a written id the store does not hold (an id
not admitted yet, whose step trained the shared row) is never read into a delta.

The journal lives in memory only: after a restart the first push is full. It is bounded: past
``max_ids`` noted ids it is dropped, and a delta over the lost stretch carries every row of the store
(a superset of what changed, so still a correct delta).
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch

READ_CHUNK = 65_536  # ids read from the store at once


class ChangeJournal:
    """The store, with the ids of its writes since each :meth:`cut` noted. Anything not defined here is
    the store's own (``journal.lookup is store.lookup``)."""

    def __init__(self, store, max_ids: int = 16_000_000):
        self.store = store
        self.max_ids = int(max_ids)
        self.mark = 0  # writes go into segment mark + 1
        self._open: dict[str, list[np.ndarray]] = {}  # the segment being written
        self._open_n = 0
        self._sealed: list[tuple[int, dict[str, np.ndarray]]] = []  # (mark, unique ids per table), oldest first
        self._sealed_n = 0
        self._lost_through = -1  # marks <= this are not fully journaled (dropped past max_ids)
        self._deleted_open: dict[str, list[np.ndarray]] = {}  # ids evicted in the open segment
        self._deleted: list[tuple[int, dict[str, np.ndarray]]] = []  # (mark, evicted ids per table), oldest first
        self.last_deleted: dict[str, np.ndarray] = {}  # what the last snapshot_rows' delta deletes
        self._cut_at = time.time()  # wall time of the last cut: hot rows stamped after it are noted at the next

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    # -- the writes, noted -----------------------------------------------------
    def apply_gradients(self, table: str, ids: np.ndarray, grads) -> None:
        written = self.store.apply_gradients(table, ids, grads)  # with admission: the rows it wrote
        self._note(table, ids if written is None else written)

    def upsert_rows(self, table: str, ids: np.ndarray, vectors) -> None:
        self.store.upsert_rows(table, ids, vectors)
        self._note(table, ids)

    def set_hot(self, hot: dict[str, np.ndarray]) -> dict:
        """A promoted row that was never stored is created (and stored at the next checkpoint): noted, so
        serving holds every row the trainer's store does."""
        promoted = {t: np.asarray(ids)[~self.store.hot_mask(t, ids)] for t, ids in hot.items() if len(ids)}
        stats = self.store.set_hot(hot)
        for t, ids in promoted.items():
            self._note(t, ids)
        return stats

    def evict(self, *args, **kwargs) -> dict[str, np.ndarray]:
        """The store's eviction sweep, its deleted ids noted for the next delta."""
        gone = self.store.evict(*args, **kwargs)
        for t, ids in gone.items():
            if len(ids):
                self._deleted_open.setdefault(t, []).append(np.asarray(ids, dtype=np.int64))
        return gone

    def _note(self, table: str, ids) -> None:
        a = np.array(ids, dtype=np.int64, copy=True).reshape(-1)  # a copy: callers refill their arrays
        if not len(a):
            return
        self._open.setdefault(table, []).append(a)
        self._open_n += len(a)
        if self._open_n > 2 * max(1, self._sealed_n, 1 << 20):  # repeated ids: keep the segment unique
            self._open = {t: [np.unique(np.concatenate(p))] for t, p in self._open.items()}
            self._open_n = sum(len(p[0]) for p in self._open.values())
        if self._open_n + self._sealed_n > self.max_ids:
            self._drop()

    def _drop(self) -> None:
        """Too many ids to keep: forget them; a delta reaching back over them carries every row."""
        self._lost_through = self.mark + 1
        self._open, self._open_n = {}, 0
        self._sealed, self._sealed_n = [], 0
        self._deleted_open, self._deleted = {}, []  # a delta over the lost stretch carries every row: serving
        # may then keep rows evicted in it until the next full snapshot

    # -- marks -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Ids noted since the last cut (with repeats)."""
        return self._open_n

    def _note_hot_written(self) -> None:
        """Note the hot rows the device tier stamped as written since the previous cut. The stamps and the cut's
        time come from the same wall clock on the training thread; a clock stepped back below the previous cut
        notes every hot row once (a superset: a delta may carry rows that did not change, never miss one)."""
        now = time.time()
        since = self._cut_at if now >= self._cut_at else -np.inf
        for name, t in getattr(self.store, "tables", {}).items():
            h = getattr(t, "hot", None)
            if h is None or not len(h.ts):
                continue
            sel = np.flatnonzero(h.ts >= since)
            if len(sel):
                self._note(name, h.slot_ids()[sel])
        self._cut_at = now

    def cut(self) -> int:
        """Close the current segment; rows written from now on are after the returned mark."""
        self._note_hot_written()
        self.mark += 1
        seg = {t: np.unique(np.concatenate(p)) for t, p in self._open.items()}
        if seg:
            self._sealed.append((self.mark, seg))
            self._sealed_n += sum(len(v) for v in seg.values())
        self._open, self._open_n = {}, 0
        if self._deleted_open:
            self._deleted.append((self.mark, {t: np.unique(np.concatenate(p)) for t, p in self._deleted_open.items()}))
            self._deleted_open = {}
        return self.mark

    def forget_through(self, mark: int) -> None:
        """No delta will be asked for on a base older than ``mark`` any more: drop what it would need."""
        keep = [(m, seg) for m, seg in self._sealed if m > mark]
        self._sealed = keep
        self._deleted = [(m, seg) for m, seg in self._deleted if m > mark]
        self._sealed_n = sum(len(v) for _m, seg in keep for v in seg.values())

    def changed_ids(self, since: int) -> dict[str, np.ndarray] | None:
        """Unique ids per table written after mark ``since`` (up to the last cut); None when the journal
        does not reach back that far."""
        if since < self._lost_through:
            return None
        parts: dict[str, list[np.ndarray]] = {}
        for m, seg in self._sealed:
            if m > since:
                for t, ids in seg.items():
                    parts.setdefault(t, []).append(ids)
        return {t: (p[0] if len(p) == 1 else np.unique(np.concatenate(p))) for t, p in parts.items()}

    def deleted_since(self, since: int) -> dict[str, np.ndarray]:
        """Unique ids per table evicted after mark ``since`` (up to the last cut) and not stored again since."""
        parts: dict[str, list[np.ndarray]] = {}
        for m, seg in self._deleted:
            if m > since:
                for t, ids in seg.items():
                    parts.setdefault(t, []).append(ids)
        out = {}
        for t, p in parts.items():
            ids = np.unique(np.concatenate(p))
            _, held = self.store.peek_held(t, ids)
            if (~held).any():
                out[t] = ids[~held]
        return out

    # -- rows ------------------------------------------------------------------
    def rows_since(self, since: int) -> list:
        """Arrow batches (snapshot row schema) of every row written after mark ``since``, as they are now;
        every row of the store when the journal does not reach back that far. Read at once, so the
        journal may be trimmed right after."""
        ids = self.changed_ids(since)
        if ids is None:
            return list(self.store.changed_rows(None))
        return [b for t in sorted(ids) for b in self.read_rows(t, ids[t])]

    def read_rows(self, table: str, ids: np.ndarray) -> Iterator:
        """The current vectors of ``ids`` (unique) as snapshot row batches, without side effects on the store:
        ``peek`` never writes; the lookup counters it moves (hit rates) are put back."""
        from streamrec.snapshot import rows_batch

        s = self.store
        counters = {k: getattr(s, k) for k in ("hot_hits", "cold_hits") if hasattr(s, k)}
        try:
            for lo in range(0, len(ids), READ_CHUNK):
                part = ids[lo:lo + READ_CHUNK]
                if hasattr(s, "peek_held"):  # an id whose step trained the shared row has no row of its own
                    rows, held = s.peek_held(table, part)
                    if not held.all():
                        part, rows = part[held], rows[torch.from_numpy(held).to(rows.device)]
                else:
                    rows = s.peek(table, part)
                if len(part):
                    yield rows_batch(table, part, rows)
        finally:
            for k, v in counters.items():
                setattr(s, k, v)

    def snapshot_rows(self, plan) -> tuple[object, int]:
        """The rows a snapshot of ``plan`` (``SnapshotPublisher.plan_next()``: full, parent, base mark) carries
        from this store, and the mark it is taken at (the base of the deltas built on it)."""
        full, _parent, since = plan
        mark = self.cut()
        if full:
            self.last_deleted = {}
            self.forget_through(mark)  # later deltas build on this one (or on a later full)
            return self.store.changed_rows(None), mark
        rows = self.rows_since(since)
        self.last_deleted = self.deleted_since(since)
        self.forget_through(since)
        return rows, mark
