"""``[sketch]``: the popularity sketch's accuracy, decay, hot-set publication and state."""

from __future__ import annotations

from dataclasses import dataclass

from streamrec.foundation.config import InvalidValue, check_metrics_endpoint


@dataclass
class SketchConfig:
    epsilon: float = 5e-5  # count-min error bound as a fraction of the total count (sets the width)
    delta: float = 1e-3  # probability that an estimate exceeds the epsilon bound (sets the depth)
    half_life_s: float = 600.0  # popularity counts halve every this many seconds of event time
    top_k: int = 20_000  # heavy-hitter candidates kept per sketch
    publish_interval_s: float = 5.0  # seconds between hot-set publications, at most
    change_fraction: float = 0.2  # fraction of the hot set's rows that, once changed, makes the worker publish early
    state_dir: str = "data/sketch"  # faust table state (RocksDB) of the sketch worker
    checkpoint_interval_s: float = 10.0  # seconds between snapshots of each partition's faust table (its size and build time: BENCHMARKS.md, e2e); a restart resumes from the last one
    batch_records: int = 10_000  # records the counting task reads and decodes per call
    sample_events: int = 20_000  # recent events kept to estimate hot-set coverage and hit rate
    sample_rate: float = 0.1  # fraction of events that enter that sample
    metrics_port: int = 0  # Prometheus HTTP port of the sketch worker, 0 = off
    metrics_host: str = "127.0.0.1"  # address the sketch worker's Prometheus endpoint binds (0.0.0.0 to publish it)


    def __post_init__(self) -> None:
        check_metrics_endpoint("sketch", self)
        for key in ("epsilon", "delta"):
            if not 0 < getattr(self, key) < 1:
                raise InvalidValue(key, "must be in (0, 1)", "sketch")
        if self.half_life_s <= 0:
            raise InvalidValue("half_life_s", "must be > 0", "sketch")
        for key in ("top_k", "batch_records"):
            if getattr(self, key) < 1:
                raise InvalidValue(key, "must be >= 1", "sketch")
        for key in ("publish_interval_s", "checkpoint_interval_s"):  # 0 would publish/snapshot on every record
            if getattr(self, key) <= 0:
                raise InvalidValue(key, "must be > 0", "sketch")
        if not 0 < self.change_fraction <= 1:
            raise InvalidValue("change_fraction", "must be in (0, 1]", "sketch")
        if self.sample_events < 0:
            raise InvalidValue("sample_events", "must be >= 0", "sketch")
        if not 0 <= self.sample_rate <= 1:
            raise InvalidValue("sample_rate", "must be in [0, 1]", "sketch")
