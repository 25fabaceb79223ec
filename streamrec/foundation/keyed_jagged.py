"""Every sparse field of a batch as one pair of arrays: the ids a training step hands the device.

A step moves one values array and one offsets array instead of one pair per field, so the
device pools every field with one ``embedding_bag`` (TorchRec's ``KeyedJaggedTensor``, in numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .events import EventBatch


@dataclass(frozen=True)
class KeyedJaggedIds:
    """The id lists of ``keys`` over a batch of ``batch_size`` events, key-major::

        keys        = ("user", "item")          batch_size = 3
        user's ids    [u0]   [u1 u2]   []
        item's ids    [i0]   [i1]      [i2 i3]

        values      = [u0 u1 u2 i0 i1 i2 i3]    every event's ids of a key, then the next key's
        offsets     = [0  1  3  3  4  5  7]     bag k (key k // 3, event k % 3) is values[offsets[k]:offsets[k+1]]
        key_offsets = [0  3  7]                 key j's ids are values[key_offsets[j]:key_offsets[j+1]]

    Guarantees: ``values`` is int64, ``offsets`` is int64 of length ``len(keys) * batch_size + 1``,
    starts at 0 and never decreases, and ends at ``len(values)``; an empty bag (an event without ids
    in a key) has equal neighbouring offsets and pools to zero.
    """

    keys: tuple[str, ...]
    values: np.ndarray
    offsets: np.ndarray
    batch_size: int

    @classmethod
    def from_batch(cls, batch: EventBatch, keys: Sequence[str]) -> KeyedJaggedIds:
        """The ``keys`` fields of ``batch``, in that order (one concatenation per array)."""
        keys = tuple(keys)
        b = len(batch)
        if not keys:
            return cls(keys, np.zeros(0, np.int64), np.zeros(1, np.int64), b)
        parts = [batch.sparse[k] for k in keys]
        values = np.concatenate([p.values for p in parts]).astype(np.int64, copy=False)
        offsets = np.empty(len(keys) * b + 1, np.int64)
        offsets[0] = 0
        at = 0
        for j, p in enumerate(parts):
            offsets[j * b + 1:(j + 1) * b + 1] = p.offsets[1:] + at
            at += len(p.values)
        return cls(keys, values, offsets, b)

    @property
    def key_offsets(self) -> np.ndarray:
        """``[len(keys) + 1]``: where each key's ids start in ``values`` (and where the last ends)."""
        return self.offsets[:: self.batch_size] if self.batch_size else np.zeros(len(self.keys) + 1, np.int64)

    def values_of(self, key: str) -> np.ndarray:
        """Every event's ids of ``key``, in event order (a view of ``values``)."""
        j = self.keys.index(key)
        ko = self.key_offsets
        return self.values[ko[j]:ko[j + 1]]

    def __len__(self) -> int:
        return self.batch_size
