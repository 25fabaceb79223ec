"""Hot tier: per table one contiguous device tensor of rows plus their Adagrad state.

The id -> slot index is a sorted id array and ``np.searchsorted``: a whole batch is
resolved in one vectorised call (no Python per id, no hash-map of Python ints).
The hot set changes rarely (on a new published hot set), so rebuilding the sorted
index then is cheap compared with the per-batch lookups it speeds up.
"""

from __future__ import annotations

import numpy as np
import torch

_SORT_ABOVE = 8192  # hot ids above which an unsorted query batch is sorted before searchsorted


class HotTable:
    def __init__(self, dim: int, device: torch.device):
        self.dim = dim
        self.device = device
        self.ids = np.empty(0, dtype=np.int64)       # sorted hot ids
        self.slot = np.empty(0, dtype=np.int64)      # slot of ids[k] in w/acc
        self.w = torch.empty((0, dim), dtype=torch.float32, device=device)
        self.acc = torch.empty(0, dtype=torch.float32, device=device)
        self.dirty = np.zeros(0, dtype=bool)         # changed since last write-back to the cold tier
        self.ep = np.zeros(0, dtype=np.int64)        # epoch of last change, per slot
        self.ts = np.zeros(0, dtype=np.float64)      # last-touched time, per slot
        self.gen = 0                                 # bumped by rebuild (validates remembered slots)

    def __len__(self) -> int:
        return len(self.ids)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Slot per id, -1 where the id is not hot."""
        if len(self.ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        k = self._search(ids)
        hit = self.ids[k] == ids
        return np.where(hit, self.slot[k], -1)

    def _search(self, ids: np.ndarray) -> np.ndarray:
        """searchsorted, clamped; against a large index sorted queries are several times faster
        (each probe starts where the previous ended), so a large unsorted batch is sorted first.
        A small index (<= ``_SORT_ABOVE`` ids, 64 KB: in the CPU cache) is searched as it is:
        there the sort costs more than it saves. ``hot_samples`` asks this for every id of a
        window, and most tables of a model are small."""
        if len(ids) > 512 and len(self.ids) > _SORT_ABOVE and not bool(np.all(ids[1:] >= ids[:-1])):
            order = np.argsort(ids)
            k = np.empty(len(ids), dtype=np.int64)
            k[order] = np.searchsorted(self.ids, ids[order])
        else:
            k = np.searchsorted(self.ids, ids)
        k[k == len(self.ids)] = 0
        return k

    def mask(self, ids: np.ndarray) -> np.ndarray:
        if len(self.ids) == 0:
            return np.zeros(len(ids), dtype=bool)
        return self.ids[self._search(ids)] == ids

    def rebuild(self, ids: np.ndarray, w: torch.Tensor, acc: torch.Tensor, ep: np.ndarray,
                ts: np.ndarray, dirty: np.ndarray) -> None:
        """Replace the hot set with rows ``ids`` (unique), slot k = k-th given row."""
        order = np.argsort(ids, kind="stable")
        self.gen += 1
        self.ids = ids[order]
        self.slot = order.astype(np.int64)
        self.w = w.to(self.device).contiguous()
        self.acc = acc.to(self.device).contiguous()
        self.ep = ep.astype(np.int64)
        self.ts = ts.astype(np.float64)
        self.dirty = dirty.astype(bool)

    def slot_ids(self) -> np.ndarray:
        """Id held by each slot."""
        out = np.empty(len(self.ids), dtype=np.int64)
        out[self.slot] = self.ids
        return out

    def nbytes(self) -> int:
        return self.w.numel() * 4 + self.acc.numel() * 4 + self.ids.nbytes * 2
