"""One uint64 key per ``(table, id)``, so every table shares one sketch.

The id is xor-ed with a per-table salt and scrambled with splitmix64 (a
bijection of uint64): two ids of one table never collide, and ids of different
tables collide only by 64-bit chance. The hot-set output keeps the table index
and raw id next to each key, so the mix never has to be inverted.
"""

from __future__ import annotations

import numpy as np
import xxhash

from ingest.synthetic import splitmix64

__all__ = ["table_salt", "make_keys", "splitmix64"]


def table_salt(name: str) -> np.uint64:
    """A stable 64-bit salt for a table name."""
    return np.uint64(xxhash.xxh64_intdigest(b"streamrec-sketch:" + name.encode("utf-8")))


def make_keys(name: str, ids: np.ndarray) -> np.ndarray:
    """uint64 keys for int64 ``ids`` of table ``name`` (vectorised)."""
    ids = np.asarray(ids, dtype=np.int64)
    return splitmix64(ids.view(np.uint64) ^ table_salt(name))
