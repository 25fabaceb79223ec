"""The hot set: FAE's choice of rows to keep on the device, and its wire form.

FAE (Adnan et al., VLDB'22) picks hot embedding rows from *sampled* access
counts with one threshold so that the hot rows fit a memory budget, then
estimates from the sample how many inputs are entirely hot (those train with no
slow-tier traffic). Here the access counts are the sketch's decayed heavy-hitter
estimates and the sample is a bounded ring of recent events.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from streamrec.foundation import EventBatch

from .keys import make_keys

_MAGIC = b"SRHS1"


@dataclass
class HotSet:
    """One published version of the hot set."""

    version: int
    tables: dict[str, np.ndarray]  # field name -> int64 ids that are hot
    coverage: float  # est. fraction of events whose every sparse id is hot
    hit_rate: float  # est. fraction of lookups that hit the hot set
    window_start_ms: int = 0  # event time of the oldest event the counts include
    window_end_ms: int = 0  # event time of the newest
    created_ms: int = 0  # wall clock at publication
    threshold: float = 0.0  # decayed count of the coldest row admitted
    events: int = 0  # events the counts include, undecayed (shows a reader the worker's progress)

    @property
    def rows(self) -> int:
        return int(sum(len(v) for v in self.tables.values()))

    def to_bytes(self) -> bytes:
        names = list(self.tables)
        head = json.dumps({
            "version": int(self.version), "coverage": float(self.coverage), "hit_rate": float(self.hit_rate),
            "window_start_ms": int(self.window_start_ms), "window_end_ms": int(self.window_end_ms),
            "created_ms": int(self.created_ms), "threshold": float(self.threshold),
            "events": int(self.events),
            "tables": [[n, int(len(self.tables[n]))] for n in names],
        }).encode()
        body = b"".join(np.ascontiguousarray(self.tables[n], dtype="<i8").tobytes() for n in names)
        return _MAGIC + struct.pack("<I", len(head)) + head + body

    @staticmethod
    def from_bytes(b: bytes) -> "HotSet":
        if not b or bytes(b[:5]) != _MAGIC:
            raise ValueError("not a serialised HotSet (bad magic)")
        try:
            (nh,) = struct.unpack("<I", b[5:9])
            head = json.loads(b[9:9 + nh])
            pos = 9 + nh
            tables = {}
            for name, n in head["tables"]:
                end = pos + 8 * int(n)
                if end > len(b):
                    raise ValueError(f"table {name!r} is truncated")
                tables[name] = np.frombuffer(b[pos:end], dtype="<i8").astype(np.int64)
                pos = end
            if pos != len(b):
                raise ValueError(f"{len(b) - pos} trailing bytes")
            return HotSet(version=int(head["version"]), tables=tables, coverage=float(head["coverage"]),
                          hit_rate=float(head["hit_rate"]), window_start_ms=int(head["window_start_ms"]),
                          window_end_ms=int(head["window_end_ms"]), created_ms=int(head["created_ms"]),
                          threshold=float(head.get("threshold", 0.0)), events=int(head.get("events", 0)))
        # OverflowError: 1e999 in the JSON head is inf and int(inf) overflows; escaping from here it killed
        # HotSetFollower's thread (the trainer kept its hot set for good) and raised out of latest_hotset
        except (struct.error, json.JSONDecodeError, KeyError, TypeError, OverflowError) as e:
            raise ValueError(f"corrupt HotSet bytes: {e}") from None

    def keys(self) -> np.ndarray:
        """The sketch keys of every hot (table, id), for set comparisons."""
        parts = [make_keys(n, v) for n, v in self.tables.items()]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    def changed_fraction(self, other: "HotSet | None") -> float:
        """Share of this set's rows that are not in ``other`` (1.0 when there is no other)."""
        if other is None:
            return 1.0
        mine = self.keys()
        if len(mine) == 0:
            return 0.0 if other.rows == 0 else 1.0
        return float(1.0 - np.isin(mine, other.keys()).mean())

    def same_rows(self, other: "HotSet | None") -> bool:
        return other is not None and self.rows == other.rows and self.changed_fraction(other) == 0.0

    def publish_as(self, last: "HotSet | None", due: bool, change_fraction: float, counted_more: bool) -> int | None:
        """The version to publish this set under, or None for not now.

        A new version only when the rows changed: by more than ``change_fraction`` at once, or at all
        once the interval is ``due``. The same rows with fresher counts (coverage, events) keep ``last``'s
        version, once per interval: a trainer re-applies only a new version, so an unchanged set is never
        migrated again, and readers still see the worker's progress."""
        if self.same_rows(last):
            return last.version if due and counted_more else None
        if due or self.changed_fraction(last) > change_fraction:
            return self.version
        return None


@dataclass
class EventSample:
    """A bounded sample of recent events, each as the sketch keys of its sparse ids.

    Keeps roughly ``rate`` of the events offered, and only the newest ``capacity``
    of those (older chunks are dropped whole).
    """

    capacity: int = 20_000
    rate: float = 0.1
    seed: int = 0
    _chunks: deque = field(default_factory=deque)  # (event index [n_ids], keys [n_ids], n_events)
    _events: int = 0

    def __post_init__(self):
        self._rng = np.random.default_rng(self.seed)

    @property
    def events(self) -> int:
        return self._events

    def offer(self, batch: EventBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        chosen = np.flatnonzero(self._rng.random(n) < self.rate)
        if len(chosen) == 0:
            return
        sub = batch.take(chosen)
        ev, keys = [], []
        for f, j in sub.sparse.items():
            if len(j.values):
                ev.append(np.repeat(np.arange(len(sub), dtype=np.int64), j.lengths))
                keys.append(make_keys(f, j.values))
        e = np.concatenate(ev) if ev else np.zeros(0, np.int64)
        k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        self._chunks.append((e, k, len(sub)))
        self._events += len(sub)
        while self._chunks and self._events - self._chunks[0][2] >= self.capacity:
            self._events -= self._chunks.popleft()[2]

    def frozen(self) -> "EventSample":
        """A copy that later offers do not change (chunks are never modified in place)."""
        return EventSample(self.capacity, self.rate, self.seed, deque(self._chunks), self._events)

    def coverage(self, hot_keys: np.ndarray) -> tuple[float, float]:
        """(fraction of sampled events whose every id is hot, fraction of sampled lookups that are hot)."""
        if not self._chunks:
            return 0.0, 0.0
        base, ev, keys = 0, [], []
        for e, k, n in self._chunks:  # one global event index, so a single isin covers the sample
            ev.append(e + base)
            keys.append(k)
            base += n
        e = np.concatenate(ev)
        k = np.concatenate(keys)
        hit = np.isin(k, hot_keys)
        missed = np.zeros(base, dtype=bool)
        missed[e[~hit]] = True
        return 1.0 - missed.mean(), (float(hit.mean()) if len(k) else 1.0)


@dataclass
class HotChoice:
    """What :func:`choose_hot_set` picked."""

    tables: dict[str, np.ndarray]
    threshold: float  # count of the coldest admitted row (FAE's access threshold)
    coverage: float
    hit_rate: float
    rows: int
    bytes: int


def choose_hot_set(
    fields: Sequence[str],
    tables: np.ndarray,
    ids: np.ndarray,
    counts: np.ndarray,
    budget_rows: int = 0,
    budget_bytes: int = 0,
    row_bytes: int | Mapping[str, int] = 0,
    sample: EventSample | None = None,
    min_count: float = 0.0,
    field_tables: Mapping[str, str] | None = None,
) -> HotChoice:
    """FAE's hot-set choice: the hottest candidates, by sampled count, that fit the budget.

    ``tables``/``ids``/``counts`` are candidates (field index, id, access count), as the
    sketch counts them: per field. The choice is per TABLE: ``field_tables`` maps a field to
    the table its ids are looked up in (a field not in it, or no mapping, is its own table), and
    a table shared by several fields gets, per id, the sum of its fields' counts (each field's
    count estimates that field's lookups, so the sum estimates the table's), one row per id.
    The budget is ``budget_bytes`` when > 0 (each row costs ``row_bytes``, per table or one
    number), else ``budget_rows``. One threshold over all tables, as FAE does. The result's
    tables are keyed by table name. Coverage and hit rate are computed on ``sample`` (0 without one).
    """
    fmap = dict(field_tables or {})
    names = list(dict.fromkeys(fmap.get(f, f) for f in fields))  # every table once, in first-use order
    table_of = np.array([names.index(fmap.get(f, f)) for f in fields], dtype=np.int64)
    if budget_bytes > 0:
        if isinstance(row_bytes, Mapping):
            missing = [t for t in names if t not in row_bytes]
            if missing:
                raise ValueError(f"row_bytes has no size for table {missing[0]!r}")
            per_table = np.array([row_bytes[t] for t in names], dtype=np.int64)
        else:
            if row_bytes <= 0:
                raise ValueError("a byte budget needs row_bytes > 0")
            per_table = np.full(len(names), int(row_bytes), dtype=np.int64)
    elif budget_rows < 0:
        raise ValueError(f"budget_rows must be >= 0, got {budget_rows}")
    tables = np.asarray(tables, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    if len(tables):
        tables = table_of[tables]
    if len(names) < len(fields) and len(ids):  # a shared table: one candidate per (table, id), counts summed
        by = np.lexsort((ids, tables))
        t_s, i_s = tables[by], ids[by]
        first = np.ones(len(by), bool)
        first[1:] = (t_s[1:] != t_s[:-1]) | (i_s[1:] != i_s[:-1])
        grp = np.cumsum(first) - 1
        counts = np.bincount(grp, weights=counts[by], minlength=int(first.sum()))
        tables, ids = t_s[first], i_s[first]
    order = np.argsort(-counts, kind="stable")
    order = order[counts[order] > min_count]
    if budget_bytes > 0:
        cost = np.cumsum(per_table[tables[order]])
        order = order[cost <= budget_bytes]
        used = int(per_table[tables[order]].sum())
    else:
        order = order[:budget_rows]
        used = 0
    threshold = float(counts[order[-1]]) if len(order) else float("inf")
    out = {t: np.sort(ids[order][tables[order] == i]) for i, t in enumerate(names)}
    coverage = hit_rate = 0.0
    if sample is not None and sample.events:  # the sample's keys are per field: a field's hot ids are its table's
        hot = np.concatenate([make_keys(f, out[fmap.get(f, f)]) for f in fields]) if fields else np.zeros(0, np.uint64)
        coverage, hit_rate = sample.coverage(hot)
    return HotChoice(out, threshold, coverage, hit_rate, int(len(order)), used)
