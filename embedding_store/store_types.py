"""The types at the embedding store's seams.

The values the store's ``store.*`` config keys may take, as ``typing.Literal`` aliases:
``streamrec.foundation.config`` annotates its fields with these aliases and validates them at
load time; the store's own modules check against ``typing.get_args`` of the same alias. The cold
tier's extension point (``ColdTier``). The store's internal interface (``StoreParts``): what the
modules beside ``store.py`` read and change of the store they are handed. This module imports only
the standard library at run time: it is the one piece of the store the foundation may import (an
``ignore_imports`` entry in pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Literal, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: this module loads no third-party package
    from pathlib import Path

    import numpy as np


CacheAdmission = Literal["frequency", "lru"]
"""``store.cache_admission``: the host cache admits a missed row only when it is seen more often than
what it would evict (TinyLFU-style), or admits every row (LRU)."""

Unadmitted = Literal["shared", "zero"]
"""``store.unadmitted``: what an id not yet admitted (``store.admit_min_count``) reads and trains: one
shared row per table (stored under ``UNADMITTED_ID``), or a zero vector that takes no gradient."""

Eviction = Literal["lfu", "lru"]
"""``store.eviction``: which rows a table over ``store.max_rows`` loses first: the least often looked up,
counts decayed by the time since the row's last write (``lfu``), or the least recently written (``lru``)."""

UNADMITTED_ID = -(1 << 63)
"""The id of a table's shared row for ids not yet admitted (the smallest int64; an event id of that
value reads the shared row too)."""


# -- cold tier: the extension point below the host cache ----------------------------
#
# ``ColdTier`` is what ``EmbeddingStore`` keeps rows in below its device tier and host cache. The
# built-in implementation is ``streamrec.embedding_store.cold.RocksDBColdTier`` (sharded RocksDB);
# another backend plugs in through ``EmbeddingStore(..., cold=...)``. A row is addressed by
# ``(tag, id)``: ``tag`` names its table (``rows.table_tag``), and ``salt`` (``rows.table_salt``) is
# what a sharded tier spreads the table's ids by. A record is one element of the table's structured
# record dtype (``rows.record_dtype``: vector, Adagrad accumulator, last-write time, epoch); a tier
# stores it as opaque bytes (``rows.pack_records``) and never interprets them.


@runtime_checkable
class ColdTier(Protocol):
    """Durable rows of every table of one store.

    Contract: ``get`` returns exactly what the last ``write``/``put`` of each row stored
    (a deleted or never-stored row is a zero record with ``found`` False). ``write`` is
    atomic as a whole: after a crash the tier reopens with all of it or none of it.
    ``put`` is atomic per row only (the host cache's write-back; only checkpoints are
    consistent points while the cache is on). ``checkpoint(dest)`` writes a copy of every
    row into the empty directory ``dest`` that a tier opened there reads back unchanged.
    ``get`` may run on the store's prefetch thread while the caller's thread writes;
    writes come from one thread at a time.
    """

    def get(self, tag: int, salt: int, ids: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Records of unique ``ids`` (zero records where absent) and the bool mask of stored ones."""
        ...

    def write(self, tag: int, salt: int, ids: np.ndarray, new: np.ndarray | None,
              old: np.ndarray, old_found: np.ndarray) -> None:
        """Set rows ``ids`` to records ``new`` (None: delete them), atomically as a whole; ``old`` and
        ``old_found`` are their current records, which the caller has read (a tier may keep them to
        roll a torn write back)."""
        ...

    def put(self, tag: int, salt: int, ids: np.ndarray, new: np.ndarray) -> None:
        """Set rows ``ids`` to records ``new``, atomically per row."""
        ...

    def scan(self) -> Iterator[tuple[np.ndarray, np.ndarray, list[bytes]]]:
        """Every stored row as ``(tags, ids, records)`` chunks; ``records`` are packed record bytes."""
        ...

    def count_estimate(self) -> int:
        """About how many rows are stored."""
        ...

    def checkpoint(self, dest: Path) -> None:
        """A durable copy of every row into ``dest`` (an existing empty directory)."""
        ...

    def sync_wal(self) -> None:
        """Make every acknowledged write survive power loss."""
        ...

    def io_stats(self) -> Mapping[str, float]:
        """Counters for ``EmbeddingStore.stats()`` (rows read and written, bytes, seconds)."""
        ...

    def close(self) -> None:
        ...
