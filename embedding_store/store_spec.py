"""StoreSpec: everything that decides how an ``EmbeddingStore`` opens, as one typed value.

A spec is checked when it is made (table names and widths, shard count, host cache size, each
table's init scale), so a bad one is refused with a one-line :class:`StoreError` before any
directory is touched. ``StoreSpec.from_sections`` builds the spec a trainer or a bench uses from the
``store`` and ``model`` config sections and the device tier's budget (``hot_budget``); a test or a
tool that opens a store of its own writes the fields it needs and keeps the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from .errors import StoreError
from .rows import table_tag

if TYPE_CHECKING:
    import torch

    from streamrec.foundation import HotBudget
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig

DEFAULT_INIT_SCALE = 0.05


@dataclass(frozen=True)
class StoreSpec:
    """How to open one store.

    Layout (fixed when the store is created; a reopen must agree): ``path`` (its directory), ``tables``
    ({name: row width}), ``shards`` of the RocksDB cold tier, ``seed`` of the deterministic initial rows,
    ``max_id`` (optional per-table id bound ``[0, max_id)``).
    Device tier: ``device``, at most ``hot_capacity_rows`` rows and, when ``hot_capacity_bytes`` > 0, at most
    that many device bytes. Rows: ``lr``/``eps`` of row-wise Adagrad, ``init_scale`` (one half-width, or one
    per table). Host and cold tiers: ``host_cache_rows`` (0: off, every cold write goes straight to RocksDB)
    and its ``cache_admission``, ``block_cache_mb``, ``memtable_mb``, ``sync`` (fsync every write),
    ``read_only``. Lean tables (``admission.py``, ``eviction.py``): ``admit_min_count``, ``unadmitted``,
    ``admit_counter_mb``, ``max_rows``, ``eviction``, ``lfu_half_life_s``, ``evict_slack``.
    """

    path: str
    tables: Mapping[str, int]
    shards: int = 4
    seed: int = 0
    device: str | torch.device = "cpu"
    hot_capacity_rows: int = 0
    hot_capacity_bytes: int = 0
    lr: float = 0.05
    eps: float = 1e-8
    init_scale: float | Mapping[str, float] = DEFAULT_INIT_SCALE
    block_cache_mb: int = 256
    host_cache_rows: int = 0
    cache_admission: str = "frequency"
    read_only: bool = False
    max_id: Mapping[str, int] | None = None
    sync: bool = False
    memtable_mb: int = 64
    admit_min_count: int = 0
    unadmitted: str = "shared"
    admit_counter_mb: float = 8.0
    max_rows: int = 0
    eviction: str = "lfu"
    lfu_half_life_s: float = 3600.0
    evict_slack: float = 0.1

    def __post_init__(self) -> None:
        _check_tables(self.tables)
        if not 1 <= self.shards <= 256:
            raise StoreError(f"shards must be in 1..256, got {self.shards}")
        if self.host_cache_rows < 0:
            raise StoreError(f"host_cache_rows must be >= 0, got {self.host_cache_rows}")
        for name in self.tables:
            scale = self.table_init_scale(name)
            if not 0 < scale <= 1e3:
                raise StoreError(f"table {name!r}: init scale must be in (0, 1000], got {scale!r}")

    @property
    def default_init_scale(self) -> float:
        """The one half-width of every table, or the default where the scales are given per table."""
        return DEFAULT_INIT_SCALE if isinstance(self.init_scale, Mapping) else float(self.init_scale)

    def table_init_scale(self, name: str) -> float:
        """The half-width of table ``name``'s uniform initial rows."""
        if isinstance(self.init_scale, Mapping):  # one per table (DLRM's sqrt(1/rows), ModelConfig.init_scales)
            return float(self.init_scale.get(name, DEFAULT_INIT_SCALE))
        return float(self.init_scale)

    @classmethod
    def from_sections(cls, store: StoreConfig, model: ModelConfig, budget: HotBudget,
                      device: str | torch.device, path: str | None = None, read_only: bool = False) -> StoreSpec:
        """The store a trainer keeps for ``model``: one table per ``model.tables`` entry (a table shared by
        several fields once, at its own width), its rows initialised at ``model.init_scales`` per table, its
        device tier sized by ``budget`` (``hot_budget``), everything else from the ``store`` section (at
        ``store.path`` unless ``path`` is given)."""
        return cls(path or store.path, dict(model.tables), shards=store.shards, seed=model.seed, device=device,
                   hot_capacity_rows=budget.rows, hot_capacity_bytes=budget.bytes, lr=store.adagrad_lr,
                   eps=store.adagrad_eps, init_scale=model.init_scales(store.init_scale),
                   block_cache_mb=store.block_cache_mb, host_cache_rows=store.host_cache_rows,
                   cache_admission=store.cache_admission, read_only=read_only,
                   admit_min_count=store.admit_min_count, unadmitted=store.unadmitted,
                   admit_counter_mb=store.admit_counter_mb, max_rows=store.max_rows, eviction=store.eviction,
                   lfu_half_life_s=store.lfu_half_life_s, evict_slack=store.evict_slack)


def _check_tables(tables: Mapping[str, int]) -> None:
    """Refuse an empty table set, a bad name or width, and two names with the same key prefix."""
    import numpy as np

    if not tables:
        raise StoreError("an EmbeddingStore needs at least one table")
    for name, dim in tables.items():
        if not isinstance(name, str) or not name:
            raise StoreError(f"table names must be non-empty strings, got {name!r}")
        if not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise StoreError(f"table {name!r}: dim must be a positive int, got {dim!r}")
    tags: dict[int, str] = {}
    for name in tables:
        t = table_tag(name)
        if t in tags:
            raise StoreError(f"tables {tags[t]!r} and {name!r} hash to the same key prefix; rename one")
        tags[t] = name
