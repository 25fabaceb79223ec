"""The store's internal interface: what the modules beside ``store.py`` may use of ``EmbeddingStore``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol

if TYPE_CHECKING:  # annotations only
    from concurrent.futures import Executor
    from pathlib import Path

    import numpy as np
    import torch

    from .store_types import ColdTier
    from .table import HotQueue, Probes, Table


# -- the store's internal interface ---------------------------------------------------
#
# ``EmbeddingStore`` (store.py) holds the state and the public API; each other responsibility is a
# module of functions that take the store (rowpath, lookup, optimizer, migration, checkpoint, export,
# expiry, eviction, admission, stats). ``StoreParts`` is everything those functions may use of it:
# nothing else of the store is theirs to read.


class StoreParts(Protocol):
    """The store as the modules beside ``store.py`` see it."""

    # settings (``StoreSpec``), fixed once the store is open
    path: Path
    device: torch.device
    seed: int
    lr: float
    eps: float
    read_only: bool
    hot_capacity_rows: int
    hot_capacity_bytes: int
    eviction: str
    lfu_half_life_s: float
    evict_slack: float
    # state
    tables: dict[str, Table]  # every table's rows, tiers and counters, by name
    cold: ColdTier
    prefetch_pool: Executor  # the one thread that reads the next batch's cold rows
    probes: Probes  # where the last lookup and prefetch of each table found its rows
    hot_queue: HotQueue | None  # device-tier updates queued inside ``fused_hot_updates``, else None
    hot_hits: int
    cold_hits: int
    created: int

    def table(self, table: str) -> Table:
        """The table named ``table``; ``StoreError`` when the store is closed or has no such table."""
        ...

    def check_writable(self) -> None:
        """``StoreError`` when the store is open read-only."""
        ...

    def table_by_tag(self, tag: int) -> Table | None:
        """The table whose cold-tier keys carry ``tag``."""
        ...

    @property
    def epoch(self) -> int:
        """The last checkpoint's epoch."""
        ...

    @property
    def write_epoch(self) -> int:
        """The epoch a write stamps on its rows (one past the last checkpoint's)."""
        ...

    @property
    def manifest(self) -> dict:
        """A copy of the store's manifest."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` as the last checkpoint's, in memory and in the manifest on disk."""
        ...

    def lay_out_hot(self) -> None:
        """Lay the hot rows out in their arenas and index them again."""
        ...

    def hot_row_bytes(self, table: str) -> int:
        ...

    def hot_bytes_of(self, counts: Mapping[str, int]) -> int:
        ...

    def set_hot(self, hot: dict[str, np.ndarray]) -> dict:
        ...

    def delete_rows(self, table: str, ids: np.ndarray) -> int:
        ...

    def peek_held(self, table: str, ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        ...
