"""Per-table occurrence counts of ids in training (a count-min of bytes) and the admission rule over them."""

from __future__ import annotations

import numpy as np

from streamrec.foundation import splitmix64

from .store_types import UNADMITTED_ID

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
