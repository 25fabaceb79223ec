"""``[store]``: the embedding store's tiers, optimizer, admission and eviction."""

from __future__ import annotations

from dataclasses import dataclass

from streamrec.foundation.config import InvalidValue, check_choice

from .store_types import CacheAdmission, Eviction, Unadmitted


@dataclass
class StoreConfig:
    path: str = "data/store"  # directory of the trainer's sharded RocksDB cold tier
    shards: int = 4  # RocksDB shards (separate databases) in the cold tier
    block_cache_mb: int = 256  # RocksDB block cache shared by the shards (MiB)
    host_cache_rows: int = 100_000  # bounded host-memory cache of cold rows (0 = off)
    cache_admission: CacheAdmission = "frequency"  # host cache admission: frequency (TinyLFU-style: a missed row enters only if seen more often than what it would evict) | lru (every row)
    expire_after_s: float = 0.0  # seconds a cold row may go untouched before the trainer deletes it, swept at checkpoints (0 = never)
    adagrad_lr: float = 0.05  # row-wise Adagrad learning rate of embedding rows
    adagrad_eps: float = 1e-8  # row-wise Adagrad epsilon
    init_scale: float = 0.05  # rows start uniform in [-init_scale, init_scale], for a field with neither expected_ids nor init_scale
    admit_min_count: int = 0  # an id gets its own row once seen this many times in training (0 or 1 = every id at once; 2 on long-tail streams: docs/lean-tables.md)
    unadmitted: Unadmitted = "zero"  # what an id not admitted yet reads and trains: zero (nothing, no gradient) | shared (one learned row per table; one trainer only)
    admit_counter_mb: float = 8.0  # memory of each table's admission counters (count-min, 1 byte per counter); more = fewer ids admitted by collision
    max_rows: int = 0  # rows each table may hold over all tiers, RocksDB included (0 = no cap); a trainer group's rank holds its share
    eviction: Eviction = "lfu"  # which rows a table over max_rows loses: lfu (fewest lookups, decayed by age) | lru (least recently written)
    lfu_half_life_s: float = 3600.0  # lfu: a row's lookup count halves for every this many seconds since its last write
    evict_slack: float = 0.1  # a table may grow to max_rows * (1 + evict_slack) before a sweep cuts it back to max_rows

    def __post_init__(self) -> None:
        check_choice("store", self, "cache_admission", CacheAdmission)
        check_choice("store", self, "unadmitted", Unadmitted)
        check_choice("store", self, "eviction", Eviction)
        ranges = (("shards", 1, 256, "must be in 1..256"),
                  ("admit_min_count", 0, 255, "must be in 0..255 (0 = admit every id)"),
                  ("admit_counter_mb", 0.01, 65_536, "must be in 0.01..65536 MiB"),
                  ("evict_slack", 0, 10, "must be in 0..10"))
        for key, low, high, message in ranges:
            if not low <= getattr(self, key) <= high:
                raise InvalidValue(key, message, "store")
        if self.max_rows < 0:
            raise InvalidValue("max_rows", "must be >= 0 (0 = no cap)", "store")
        if self.lfu_half_life_s <= 0:
            raise InvalidValue("lfu_half_life_s", "must be > 0", "store")
