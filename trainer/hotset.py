"""Where the trainer's hot set comes from.

- ``topic``: the popularity-sketch worker's compacted ``hot-set`` topic (the
  pipeline's normal mode), followed with ``streamrec.sketch.HotSetFollower``.
- ``sample``: counted in-process from the first events (FAE finds hot rows from a
  sample, not a full pass), optionally re-counted every N events. For runs
  without the sketch worker: tests, benchmarks, a single-process trainer.
- ``none``: no hot tier; every row stays in the store.

Hot sets are per TABLE (``model.tables``): a table shared by several fields (``user``
and ``last_clicked_user`` looking ids up in table ``user``) counts an id once per lookup
from any of its fields, so its hot rows are those hottest over all of them, and each
hot row is held once. With a byte budget (``hot.budget_bytes``) a row costs its own
table's width (``foundation.HotBudget``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, get_args

import numpy as np

from streamrec.foundation import EventBatch, HotBudget

from .hotset_types import HotSetSource, HotUpdate
from .trainer_types import HotSource

if TYPE_CHECKING:
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.ingest.ingest_config import KafkaConfig
    from streamrec.trainer.trainer_config import TrainerConfig


def top_rows(counts: dict[str, tuple[np.ndarray, np.ndarray]], budget: int | HotBudget) -> tuple[dict[str, np.ndarray], float]:
    """The most frequent (table, id) over all tables that fit ``budget`` (a row count, or a
    :class:`HotBudget` whose bytes are spent at each table's width, hottest first), and the share
    of lookups they cover."""
    tabs, ids, cnts = [], [], []
    for i, (t, (u, c)) in enumerate(sorted(counts.items())):
        tabs.append(np.full(len(u), i, np.int32))
        ids.append(u)
        cnts.append(c)
    if not ids:
        return {}, float("nan")
    tab, idv, cnt = np.concatenate(tabs), np.concatenate(ids), np.concatenate(cnts)
    total = float(cnt.sum())
    names = sorted(counts)
    if isinstance(budget, HotBudget) and budget.bytes > 0:
        order = np.lexsort((idv, tab, -cnt))  # hottest first, ties in a fixed order
        keep = order[:budget.fit(tab[order], names)]
    else:
        budget = budget.rows if isinstance(budget, HotBudget) else int(budget)
        if budget < len(cnt):
            keep = np.argpartition(-cnt, budget)[:budget] if budget > 0 else np.zeros(0, np.int64)
        else:
            keep = np.arange(len(cnt))
    out = {n: np.sort(idv[keep][tab[keep] == i]) for i, n in enumerate(names)}
    return out, (float(cnt[keep].sum()) / total if total else float("nan"))


@dataclass
class SampleHotSource:
    """Exact id counts over a sample of the stream -> the top rows that fit ``budget`` (a row
    count or a :class:`HotBudget`). Counted per table: ``field_tables`` maps each field to its
    table (a field not in it is its own table), so a shared table's counts are its fields' summed."""

    fields: list[str]
    budget: int | HotBudget
    sample_events: int = 50_000
    refresh_events: int = 0  # 0 = decide once
    field_tables: Mapping[str, str] | None = None
    version: int = 0
    _seen: int = 0
    _counts: dict = field(default_factory=dict)
    _ready: HotUpdate | None = None

    def observe(self, batch: EventBatch) -> None:
        if self.version and not self.refresh_events:
            return
        tables = self.field_tables or {}
        for f in self.fields:
            t = tables.get(f, f)
            u, c = np.unique(batch.sparse[f].values, return_counts=True)
            if t in self._counts:
                pu, pc = self._counts[t]
                allu = np.concatenate([pu, u])
                allc = np.concatenate([pc, c])
                u, inv = np.unique(allu, return_inverse=True)
                c = np.bincount(inv.reshape(-1), weights=allc, minlength=len(u)).astype(np.int64)
            self._counts[t] = (u, c)
        self._seen += len(batch)
        need = self.sample_events if not self.version else self.refresh_events
        if self._seen >= need:
            tables, coverage = top_rows(self._counts, self.budget)
            self.version += 1
            self._ready = HotUpdate(self.version, tables, coverage)
            self._seen, self._counts = 0, {}

    def poll(self) -> HotUpdate | None:
        u, self._ready = self._ready, None
        return u


class TopicHotSource:
    """Newest hot set published by the sketch worker on the ``hot-set`` topic."""

    def __init__(self, bootstrap: str, topic: str, security: dict | None = None):
        from streamrec.sketch import HotSetFollower

        self.follower = HotSetFollower(bootstrap, topic, security=security)
        self.version = 0
        self._applied = None  # the last set handed over: an unchanged one under a new version is not migrated again

    def observe(self, batch: EventBatch) -> None:
        pass

    def poll(self) -> HotUpdate | None:
        hs = self.follower.latest()
        if hs is None or hs.version == self.version:
            return None
        self.version = hs.version
        if hs.same_rows(self._applied):
            return None
        self._applied = hs
        return HotUpdate(int(hs.version), dict(hs.tables), float(getattr(hs, "coverage", float("nan"))),
                         float(getattr(hs, "hit_rate", float("nan"))))

    def close(self) -> None:
        close = getattr(self.follower, "close", None)
        if close:
            close()


class NoHotSource:
    version = 0

    def observe(self, batch: EventBatch) -> None:
        pass

    def poll(self) -> HotUpdate | None:
        return None


def make_hot_source(trainer: TrainerConfig, model: ModelConfig, kafka: KafkaConfig, budget: HotBudget,
                    bootstrap: str | None) -> HotSetSource:
    """The hot-set source ``trainer.hot_source`` names, choosing at most ``budget`` (the store's device tier,
    ``foundation.hot_budget``); ``kafka``: the hot-set topic and the cluster's security settings."""
    kind = trainer.hot_source
    if kind == "none" or budget.rows == 0:
        return NoHotSource()
    if kind == "sample":
        return SampleHotSource(model.field_names, budget, trainer.hot_sample_events,
                               trainer.hot_refresh_events, field_tables=dict(model.field_tables))
    if kind == "topic":
        if not bootstrap:
            raise ValueError("trainer.hot_source='topic' needs a Kafka bootstrap")
        from streamrec.ingest import client_settings

        return TopicHotSource(bootstrap, kafka.hotset_topic, security=client_settings(kafka))
    raise ValueError(f"trainer.hot_source must be one of {', '.join(get_args(HotSource))}, got {kind!r}")
