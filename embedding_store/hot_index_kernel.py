"""The hot index's compiled probe (numba, ``cache=True``: on disk after the first process).

Imported on the first :meth:`~.hot_index.HotIndex.find` of an index built ``compiled``, not with
the store: loading numba and a kernel costs resident memory, which a store that never probes this
way (a CPU trainer's, serving's, ``bench store``'s) does not pay.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def _home(salt, key, mask):
    """splitmix64 of ``key ^ salt`` (``streamrec.foundation.splitmix64``'s finaliser), masked to a cell."""
    z = (np.uint64(key) ^ salt) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64((z ^ (z >> np.uint64(31))) & mask)


@numba.njit(cache=True, nogil=True)
def find(salts, mask, t_ids, t_codes, t_slots, codes, ids, out):
    """``out[i]``: the slot of ``(codes[i], ids[i])`` in the table ``t_*``, -1 where absent."""
    m = np.int64(mask)
    for i in range(len(ids)):
        c, k = codes[i], ids[i]
        s = _home(salts[c], k, mask)
        r = -1
        while t_codes[s] != -1:
            if t_codes[s] == c and t_ids[s] == k:
                r = t_slots[s]
                break
            s = (s + 1) & m
        out[i] = r
