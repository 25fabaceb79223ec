"""Stored-key filter: which rows *may* be in RocksDB, answered in memory.

Why: with unbounded ids most cold misses under Zipf are first touches — ids never
stored. RocksDB answers those through its bloom filters, but a multi-get still pays per
key (Python key objects, memtables, every L0 file's filter). This set
answers "never stored" for a whole batch in a few vectorised numpy calls, so only
candidates are read.

Exactness: it is a superset of the stored keys — every key is added *before* it is
written and never removed (a deleted row just costs a read). So a miss here is a
certain "not stored" (no false negatives); a false positive (two ids of one table
sharing a 32-bit fingerprint, ~n/2^32) only costs the read the store did before.

Layout per table tag: sorted uint32 fingerprints in a large ``base`` and a small
``delta`` (new keys merged in with ``np.insert``, an O(len(delta)) memmove); the delta
is merged into the base when it passes 1/8 of it, so inserts stay amortised O(1)
memmove-bytes per key. 4 bytes per stored row. The pair is swapped as one tuple, so a
reader on another thread (the prefetcher) always sees a consistent pair.
"""

from __future__ import annotations

import numpy as np

from streamrec.foundation import splitmix64

_TAG_MIX = np.uint64(0xD6E8FEB86659FD93)
_EMPTY = np.empty(0, dtype=np.uint32)


def _member(arr: np.ndarray, fp: np.ndarray) -> np.ndarray:
    if len(arr) == 0:
        return np.zeros(len(fp), dtype=bool)
    k = np.searchsorted(arr, fp)
    k[k == len(arr)] = 0
    return arr[k] == fp


class StoredKeys:
    """Superset of the (tag, id) keys stored in the cold tier; see the module docstring."""

    def __init__(self, min_delta: int = 1 << 16):
        self._sets: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.min_delta = min_delta

    @staticmethod
    def fingerprints(tag: int, ids: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            h = splitmix64(ids.astype(np.uint64) ^ (np.uint64(tag) * _TAG_MIX))
        return (h >> np.uint64(32)).astype(np.uint32)

    def may_contain(self, tag: int, ids: np.ndarray) -> np.ndarray:
        """Bool per id: False means the key was certainly never stored."""
        sets = self._sets.get(tag)
        if sets is None or len(ids) == 0:
            return np.zeros(len(ids), dtype=bool)
        base, delta = sets  # one consistent pair, even while another thread adds
        fp = self.fingerprints(tag, ids)
        out = _member(delta, fp)
        if len(base):
            out |= _member(base, fp)
        return out

    def add(self, tag: int, ids: np.ndarray) -> None:
        """Record keys about to be stored (call before writing them; single writer)."""
        if len(ids) == 0:
            return
        fp = np.unique(self.fingerprints(tag, ids))
        base, delta = self._sets.get(tag, (_EMPTY, _EMPTY))
        if len(base):
            fp = fp[~_member(base, fp)]
        if len(delta):
            fp = fp[~_member(delta, fp)]
        if len(fp) == 0:
            return
        delta = np.insert(delta, np.searchsorted(delta, fp), fp)
        if len(delta) > max(self.min_delta, len(base) >> 3):
            base, delta = np.insert(base, np.searchsorted(base, delta), delta), _EMPTY
        self._sets[tag] = (base, delta)

    def __len__(self) -> int:
        return sum(len(b) + len(d) for b, d in self._sets.values())

    def nbytes(self) -> int:
        return sum(b.nbytes + d.nbytes for b, d in self._sets.values())
