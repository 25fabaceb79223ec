"""One uint64 key per ``(table, id)``, so every table shares one sketch.

The key is ``splitmix64(id ^ table_salt(table))`` (:func:`streamrec.foundation.salted_mix`,
the same mix the store shards by): two ids of one table never collide (splitmix64 is
a bijection of uint64), and ids of different tables collide only by 64-bit chance.
The hot-set output keeps the table index and raw id next to each key, so the mix
never has to be inverted.
"""

from __future__ import annotations

import numpy as np

from streamrec.foundation import salted_mix, table_salt

__all__ = ["make_keys", "key_salt"]


def key_salt(name: str) -> np.uint64:
    """The table's salt as the uint64 the compiled kernels take."""
    return np.uint64(table_salt(name))


def make_keys(name: str, ids: np.ndarray) -> np.ndarray:
    """uint64 keys for int64 ``ids`` of table ``name`` (vectorised)."""
    return salted_mix(table_salt(name), np.asarray(ids, dtype=np.int64))
