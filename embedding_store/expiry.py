"""Expiry: cold rows untouched for a configured time are deleted (they read as their init again)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import rowpath
from .export import scan_cold

if TYPE_CHECKING:
    from .store_parts import StoreParts


def expire(store: StoreParts, older_than_s: float, clock: Callable[[], float] = time.time) -> int:
    """Delete cold rows whose last write is more than ``older_than_s`` seconds before ``clock()``; returns
    how many. Rows are stamped with ``time.time()``, the default clock; a test passes a clock of its own
    so that where the cutoff falls does not depend on how long the test took. Hot rows never expire;
    cached rows are written back first, so the cold tier decides."""
    store.check_writable()
    rowpath.settle_cold(store, store.tables.values())
    cutoff = clock() - float(older_than_s)
    n = 0
    for t, ids, recs in scan_cold(store):
        old = (recs["ts"] < cutoff) & ~t.hot.mask(ids)
        if old.any():
            store.cold.write(t.tag, t.salt, ids[old], None, recs[old], np.ones(int(old.sum()), bool))
            n += int(old.sum())
    return n
