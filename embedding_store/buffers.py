"""Small per-table buffers of cold rows that were just read or prefetched.

A training step reads a batch of cold rows in ``lookup`` and needs them again in
``apply_gradients``; the prefetcher reads the next batch's rows while this one
trains. Both are buffers of (ids, records). Every write through the store is applied
to every buffer of its table (or queued as an overlay while a prefetch is still
reading), so a buffer hit is always the row's current value — no lost update even
when a write races with a background read.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np

from .rows import gather, scatter


class RowBuffer:
    def __init__(self, ids: np.ndarray, future: Future | None = None,
                 recs: np.ndarray | None = None, found: np.ndarray | None = None):
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self._order = order
        self.future = future
        self.recs = None if recs is None else gather(recs, order)
        self.found = None if found is None else found[order]
        self._overlays: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._lock = threading.Lock()

    def settle(self) -> None:
        """Wait for the background read, then replay writes that happened meanwhile."""
        if self.future is None:
            return
        recs, found = self.future.result()
        with self._lock:
            self.recs, self.found = gather(recs, self._order), found[self._order]
            self.future = None
            for ids, recs_new in self._overlays:
                self._apply(ids, recs_new)
            self._overlays = []

    def _apply(self, ids: np.ndarray, recs_new: np.ndarray | None) -> None:
        k = np.searchsorted(self.ids, ids)
        k[k == len(self.ids)] = 0
        hit = self.ids[k] == ids if len(self.ids) else np.zeros(len(ids), dtype=bool)
        if not hit.any():
            return
        if recs_new is None:  # deleted
            self.found[k[hit]] = False
            self.recs[k[hit]] = 0
        else:
            scatter(self.recs, k[hit], gather(recs_new, hit))
            self.found[k[hit]] = True

    def on_write(self, ids: np.ndarray, recs_new: np.ndarray | None) -> None:
        with self._lock:
            if self.future is not None:
                self._overlays.append((ids.copy(), None if recs_new is None else recs_new.copy()))
                return
        self._apply(ids, recs_new)

    def take(self, ids: np.ndarray, recs: np.ndarray, found: np.ndarray, have: np.ndarray) -> None:
        """Fill ``recs/found`` for ``ids`` this buffer holds; mark them in ``have``."""
        if len(self.ids) == 0:
            return
        need = ~have
        if not need.any():
            return
        k = np.searchsorted(self.ids, ids)
        k[k == len(self.ids)] = 0
        hit = (self.ids[k] == ids) & need
        if not hit.any():
            return
        self.settle()
        scatter(recs, hit, gather(self.recs, k[hit]))
        found[hit] = self.found[k[hit]]
        have |= hit
