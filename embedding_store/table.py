"""One table's share of the store's state, the remembered index probes of a batch, and the queue of
device-tier updates of a fused step.

``Table`` holds what every part of the store reads for one table: its row identity
(salt, key tag, record dtype, init scale), its hot tier, its host cache (None when
the cache is off), its prefetch buffers, and its lean-table state (admission counters, row cap);
it checks the ids every call of the store passes for it (``checked_ids``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .admission_counter import AdmissionCounter
from .buffers import RowBuffer
from .cache import HostCache
from .errors import StoreError
from .hot import HotTable
from .rows import record_dtype, table_salt, table_tag

MAX_BUFFERS = 3  # per table: the last read batch + up to two prefetched batches


class Table:
    def __init__(self, name: str, dim: int, device: torch.device, max_id: int | None, init_scale: float):
        self.name = name
        self.dim = dim
        self.salt = table_salt(name)
        self.tag = table_tag(name)
        self.dtype = record_dtype(dim)
        self.hot = HotTable(dim, device)
        self.buffers: list[RowBuffer] = []
        self.max_id = max_id
        self.init_scale = init_scale
        self.cache: HostCache | None = None
        self.admission: AdmissionCounter | None = None  # counts of training steps per id (admission, LFU)
        self.max_rows = 0  # cap on the table's stored rows (0 = none)
        self.rows_at_sweep: int | None = None  # stored rows after the last eviction sweep (None: not swept yet)
        self.created = 0  # rows created by training since that sweep
        self.evicted = 0  # rows deleted by eviction sweeps

    def checked_ids(self, ids, what: str = "ids") -> np.ndarray:
        """``ids`` of this table as a 1-D int64 array; :class:`StoreError` unless integers within its id bound."""
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        a = np.asarray(ids)
        if a.ndim != 1:
            raise StoreError(f"{self.name}: {what} must be a 1-D array, got shape {a.shape}")
        if a.dtype.kind not in "iu":
            if a.size == 0:
                return np.empty(0, dtype=np.int64)
            raise StoreError(f"{self.name}: {what} must be integers, got dtype {a.dtype}")
        if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
            raise StoreError(f"{self.name}: {what} must fit in int64; got {int(a.max())}")
        a = a.astype(np.int64, copy=False)
        if self.max_id is not None and a.size and (a.min() < 0 or a.max() >= self.max_id):
            bad = a[(a < 0) | (a >= self.max_id)][0]
            raise StoreError(f"{self.name}: id {int(bad)} is outside [0, {self.max_id})")
        return a

    def checked_unique_ids(self, ids) -> np.ndarray:
        """:meth:`checked_ids`, refused when an id repeats."""
        a = self.checked_ids(ids)
        if len(a) > 1:
            if not np.all(a[1:] > a[:-1]):  # sorted-unique fast path, else check properly
                s = np.sort(a)
                d = s[1:] == s[:-1]
                if d.any():
                    raise StoreError(f"{self.name}: ids must be unique here; id {int(s[1:][d][0])} repeats "
                                     "(sum the gradients of repeated ids first)")
        return a


class Probe(NamedTuple):
    """Where the rows of ``ids`` of one table sit: the hot slot of each id and the cache
    slot of each cold one (-1: absent). Remembered so the next call on the same ids
    (prefetch -> lookup -> apply_gradients) skips both index probes; valid only while
    neither index has changed, which their generation counters tell."""

    table: str
    ids: np.ndarray  # owned (a copy where the caller's array could be refilled)
    hot: np.ndarray
    cache: np.ndarray
    hot_gen: int
    cache_gen: int
    # lookup's probe only: the cold rows without a cache slot are exactly the rows the cache's admission
    # refused, and these are their current records and stored flags (in cold-row order), so the
    # apply_gradients that follows writes them back without reading them again. Any write to the table
    # other than that apply_gradients drops the probe (a refused row's write-back changes no generation).
    refused: bool = False
    refused_recs: np.ndarray | None = None
    refused_found: np.ndarray | None = None

    def valid_for(self, t: Table, ids: np.ndarray) -> bool:
        return (self.table == t.name and t.cache is not None and self.hot_gen == t.hot.gen
                and self.cache_gen == t.cache.gen and np.array_equal(self.ids, ids))


class Probes:
    """The store's remembered probes, per table: the last training lookup's (``lookup``: for the
    ``apply_gradients`` that follows) and the last prefetch's (``prefetch``: for the lookup that follows).
    Per table, not one for the store: a training step looks up every table before it applies the
    gradients of any (and prefetches every table of the next step)."""

    def __init__(self) -> None:
        self.lookup: dict[str, Probe] = {}
        self.prefetch: dict[str, Probe] = {}

    def clear(self) -> None:
        """Forget every probe (the rows moved: a migration, or a scan that deletes rows)."""
        self.lookup, self.prefetch = {}, {}


HotQueue = list[tuple[Table, np.ndarray, torch.Tensor]]
"""Device-tier updates queued inside ``EmbeddingStore.fused_hot_updates``: (table, hot slots, gradients)."""
