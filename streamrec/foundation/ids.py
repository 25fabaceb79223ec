"""Ids and hashing, one definition each for every process.

- :func:`hash_id`: an event's id (int or string) -> signed 64-bit integer.
- :func:`table_salt`: a table's stable 64-bit salt. The store's RocksDB key prefix,
  shard choice and row initialisation, the sketch's keys and the synthetic
  generator all use it, so two processes agree on a row without talking.
- :func:`splitmix64` and :func:`salted_mix`: the bijective uint64 scramble and
  the ``splitmix64(id ^ salt)`` key every per-row hash is built from.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import xxhash

from .errors import EventError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def hash_id(value: str | int) -> int:
    """Map an id to a signed 64-bit integer, stably across machines and runs.

    Integers within int64 stay as they are; integers in the uint64 range wrap to
    their two's-complement value; strings are hashed with xxh64 (seed 0).
    """
    if isinstance(value, bool):
        raise EventError(f"id {value!r} is a boolean, not an integer or string")
    if isinstance(value, int):
        if INT64_MIN <= value < 2**63:
            return value
        if 2**63 <= value <= UINT64_MAX:
            return value - 2**64
        raise EventError(f"integer id {value} does not fit in 64 bits")
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not text, and no stable hash
            raise EventError(f"id {value!r} is not valid Unicode text (lone surrogate)") from None
        h = xxhash.xxh64_intdigest(raw)
        return h - 2**64 if h >= 2**63 else h
    raise EventError(f"id {value!r} has type {type(value).__name__}; expected int or str")


def hash_ids(values: Sequence[str | int]) -> np.ndarray:
    """:func:`hash_id` of each value, as int64."""
    return np.fromiter((hash_id(v) for v in values), dtype=np.int64, count=len(values))


@lru_cache(maxsize=4096)
def table_salt(name: str) -> int:
    """Stable 64-bit salt of a table (field) name: xxh64 of its UTF-8 bytes."""
    return xxhash.xxh64_intdigest(name.encode("utf-8"))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser: a bijective scramble of uint64 (a counter-based RNG).

    int64 input is reinterpreted bit for bit; the result is a new uint64 array.
    """
    x = np.asarray(x)
    # int64 -> uint64 keeps the bits: a view, no copy (the sum below makes the one copy)
    x = x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = x + _GOLD
        z ^= z >> np.uint64(30)  # in place: one temporary per line instead of three
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
        return z


def salted_mix(salt: int, ids: np.ndarray) -> np.ndarray:
    """``splitmix64(ids ^ salt)`` as uint64: one well-mixed key per (table, id)."""
    ids = np.asarray(ids)
    u = ids.view(np.uint64) if ids.dtype == np.int64 else ids.astype(np.uint64)
    return splitmix64(u ^ np.uint64(salt))
