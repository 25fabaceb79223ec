"""Heavy hitters: the top candidates by sketch estimate, kept in flat numpy arrays.

A "min-heap fed by the sketch", done in bulk: after each batch the batch's
distinct keys (with their fresh count-min estimates) are merged with the kept
candidates, and only the ``capacity`` largest survive (one argpartition). Keys
are carried with their table index and raw id so the hot set can be read back
without inverting the key mix.
"""

from __future__ import annotations

import io

import numpy as np


class HeavyHitters:
    """Keeps at most ``capacity`` (key, table, id, estimate) candidates with the largest estimates."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.keys = np.zeros(0, np.uint64)
        self.tables = np.zeros(0, np.int16)
        self.ids = np.zeros(0, np.int64)
        self.est = np.zeros(0, np.float64)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def floor(self) -> float:
        """Smallest estimate a newcomer must beat once full (0 while not full)."""
        return float(self.est.min()) if len(self.keys) >= self.capacity else 0.0

    def offer(self, keys: np.ndarray, tables: np.ndarray, ids: np.ndarray, est: np.ndarray) -> None:
        """Offer distinct keys with their current estimates (newer than any kept value).

        The kept arrays stay sorted by key, so membership is a binary search and
        newcomers are merged in linearly: no sort of the whole candidate set per batch.
        """
        if len(keys) == 0:
            return
        floor = self.floor
        if floor > 0:
            keep = est > floor
            keys, tables, ids, est = keys[keep], tables[keep], ids[keep], est[keep]
            if len(keys) == 0:
                return
        order = np.argsort(keys)
        keys, tables, ids, est = keys[order], tables[order], ids[order], est[order]
        n = len(self.keys)
        pos = np.searchsorted(self.keys, keys)
        found = np.zeros(len(keys), dtype=bool)
        if n:
            found = self.keys[np.minimum(pos, n - 1)] == keys
            self.est[pos[found]] = est[found]
        new = ~found
        if new.any():
            at = pos[new]
            self.keys = np.insert(self.keys, at, keys[new])
            self.tables = np.insert(self.tables, at, tables[new].astype(np.int16, copy=False))
            self.ids = np.insert(self.ids, at, ids[new])
            self.est = np.insert(self.est, at, est[new])
        self._trim()

    def _trim(self) -> None:
        n = len(self.keys)
        if n > self.capacity:
            keep = np.zeros(n, dtype=bool)
            keep[np.argpartition(-self.est, self.capacity - 1)[: self.capacity]] = True
            self.keys, self.tables, self.ids, self.est = (
                self.keys[keep], self.tables[keep], self.ids[keep], self.est[keep])

    def _set(self, keys, tables, ids, est) -> None:
        order = np.argsort(np.asarray(keys, dtype=np.uint64), kind="stable")
        self.keys = np.ascontiguousarray(np.asarray(keys, dtype=np.uint64)[order])
        self.tables = np.ascontiguousarray(np.asarray(tables, dtype=np.int16)[order])
        self.ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64)[order])
        self.est = np.ascontiguousarray(np.asarray(est, dtype=np.float64)[order])
        self._trim()

    def top(self, k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys, tables, ids, estimates) of the ``k`` largest, largest first."""
        order = np.argsort(-self.est, kind="stable")
        if k is not None:
            order = order[:k]
        return self.keys[order], self.tables[order], self.ids[order], self.est[order]

    def scale(self, factor: float) -> None:
        self.est *= factor

    def union_with(self, other: "HeavyHitters") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct (keys, tables, ids) over both candidate sets (for a merge that re-estimates)."""
        keys = np.concatenate([self.keys, other.keys])
        tables = np.concatenate([self.tables, other.tables])
        ids = np.concatenate([self.ids, other.ids])
        _, first = np.unique(keys, return_index=True)
        return keys[first], tables[first], ids[first]

    def replace(self, keys, tables, ids, est) -> None:
        """Set the candidates outright (keeps the ``capacity`` largest)."""
        self._set(keys, tables, ids, est)

    def copy(self) -> "HeavyHitters":
        h = HeavyHitters(self.capacity)
        h._set(self.keys.copy(), self.tables.copy(), self.ids.copy(), self.est.copy())
        return h

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, capacity=np.int64(self.capacity), keys=self.keys, tables=self.tables, ids=self.ids, est=self.est)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, b: bytes) -> "HeavyHitters":
        with np.load(io.BytesIO(b), allow_pickle=False) as z:
            h = cls(int(z["capacity"]))
            h._set(z["keys"], z["tables"], z["ids"], z["est"])
        return h
