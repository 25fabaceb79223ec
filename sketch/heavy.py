"""Heavy hitters: the top candidates by sketch estimate, kept in flat numpy arrays.

A "min-heap fed by the sketch", done in bulk: after each flush the flushed
distinct keys that beat the current floor (with their fresh count-min
estimates) are merged with the kept candidates, and only the ``capacity``
largest survive (``kernels.hh_offer``: a hash index and one partition, no
sort). Keys are carried with their table index and raw id so the hot set can
be read back without inverting the key mix. Arrays are in no particular order.
"""

from __future__ import annotations

import io

import numpy as np

from .kernels import hh_offer


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
        """Offer distinct keys with their current estimates (newer than any kept value)."""
        if len(keys) == 0:
            return
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        tables = np.ascontiguousarray(tables, dtype=np.int16)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        est = np.ascontiguousarray(est, dtype=np.float64)
        floor = self.floor
        if floor > 0:
            keep = np.flatnonzero(est > floor)
            if len(keep) < len(keys):
                keys, tables, ids, est = keys[keep], tables[keep], ids[keep], est[keep]
            if len(keys) == 0:
                return
        self.keys, self.tables, self.ids, self.est = hh_offer(
            self.keys, self.tables, self.ids, self.est, keys, tables, ids, est, self.capacity)

    def _set(self, keys, tables, ids, est) -> None:
        """Take distinct keys outright, keeping the ``capacity`` largest."""
        e = np.zeros(0)
        self.keys, self.tables, self.ids, self.est = hh_offer(
            np.ascontiguousarray(keys, dtype=np.uint64), np.ascontiguousarray(tables, dtype=np.int16),
            np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(est, dtype=np.float64),
            e.astype(np.uint64), e.astype(np.int16), e.astype(np.int64), e, self.capacity)

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
        h.replace(self.keys.copy(), self.tables.copy(), self.ids.copy(), self.est.copy())
        return h

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, capacity=np.int64(self.capacity), keys=self.keys, tables=self.tables, ids=self.ids, est=self.est)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, b: bytes) -> "HeavyHitters":
        with np.load(io.BytesIO(b), allow_pickle=False) as z:
            h = cls(int(z["capacity"]))
            h.replace(z["keys"], z["tables"], z["ids"], z["est"])
        return h
