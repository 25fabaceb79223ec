"""The join of impressions with the actions that follow them, as a deterministic state machine.

One :class:`JoinState` holds one partition of the two co-partitioned topics (both keyed by
``request_id``, so an impression and its actions share a partition number). It is fed that
partition's impressions and actions in any interleaving of the two topics' own orders, and emits
labelled :class:`Example` s. Its state lives in a key-value mapping it is given (a faust Table on
RocksDB in the worker, a dict in tests); the heaps that find what is due are rebuilt from it by
:meth:`JoinState.restore`.

Event time, two watermarks per partition: ``wi`` is the largest impression ``ts`` seen, ``wa`` the
largest action ``ts`` seen. With ``W_k`` the window of task ``k`` (its ``@window_s`` in ``join.task_actions``,
else ``join.window_s``), ``W`` the longest of them, ``L`` = ``join.allowed_lateness_s``, ``O`` =
``join.orphan_wait_s`` (all in ms here) and ``H = W + L + O`` (the dedupe horizon):

* an impression older than ``wi - H`` when it arrives is late: counted and dropped (its duplicates could no
  longer be recognised); a second impression of a ``request_id`` already held is a duplicate (counted once);
* an action of a label type counts for task ``k`` of impression ``I`` (``ts`` ``t``, ``wi`` at its arrival
  ``wi_I``) when ``a.ts <= t + W_k``, ``wa`` through the action is ``<= t + W_k + L`` and
  ``a.ts + O >= wi_I``; an action that counts for none of its type's tasks is counted once: after the
  window (past every such ``t + W_k``), else late (every window holding it had closed), else an orphan
  that expired before its impression came;
* an action whose impression has not arrived waits (an orphan) until ``wi`` passes ``a.ts + O``;
* the window of ``I`` closes when ``wa`` passes ``t + W + L`` (every action that can count for any task has
  arrived), or when ``wi`` passes ``t + H``: a partition whose actions stop still closes its windows as its
  impressions move on, and no row outlives the dedupe horizon open;
* :meth:`JoinState.advance` moves both watermarks on without a record (the join task's idle timeout,
  ``join.idle_close_s``): a partition whose two topics both stop still closes its windows and expires its
  orphans as wall time passes. Such closes depend on wall time, not on the records alone.

The rules read the order of records within each topic partition; how the two topics interleave matters only
through the close by ``wi``, and only for an action that would count but is joined after an impression more
than ``O`` of event time newer than the action's running watermark. Fed in event-time order (the join task's
merge, ``input_merge.py``) or with the actions never that far behind, the examples (not their emission
times) are the same for every interleaving: a replay from the start gives what a live run gave. Modes
(``join.mode``):

* ``window``: one example per impression, a positive as soon as every task has a counting action, else at
  the close (label 1 for tasks with a counting action, 0 for the rest);
* ``fake_negative``: a negative at once (kind ``fake_negative``), then for each task a positive when its
  first counting action arrives (kind ``positive``; other tasks' labels missing, in multi-task output).

Each example's kind travels with it twice: in the event's ``feedback`` field (the event contract's
feedback kind, which the trainer's fake-negative correction and progressive validation read) and in
the Kafka header :data:`FEEDBACK_HEADER` (``positive``, ``negative``, ``fake_negative``), for readers of
headers alone.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from .state_rows import (IMPRESSION, WAITING, WATERMARKS, ImpressionRow, WaitingAction, WatermarkRow, decoded,
                         impression_due)

FEEDBACK_HEADER = "streamrec-feedback"
KINDS = ("positive", "negative", "fake_negative")


@dataclass(frozen=True)
class JoinRules:
    """The join's parameters, in ms; ``tasks``: task name -> the action type that labels it (output order);
    ``windows``: each task's window in that order (empty: every task's is ``window_ms``)."""

    mode: str
    window_ms: int
    lateness_ms: int
    orphan_ms: int
    tasks: tuple[tuple[str, str], ...]
    single: bool = True  # one task: the output carries ``label``, else ``labels``
    windows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.windows and len(self.windows) != len(self.tasks):
            raise ValueError(f"{len(self.windows)} windows for {len(self.tasks)} tasks")

    @classmethod
    def from_config(cls, join) -> "JoinRules":
        tasks = tuple(join.tasks.items())
        windows = tuple(int(round(w * 1000)) for w in join.task_windows.values())
        return cls(join.mode, int(round(join.window_s * 1000)), int(round(join.allowed_lateness_s * 1000)),
                   int(round(join.orphan_wait_s * 1000)), tasks, single=not join.task_actions.strip(),
                   windows=windows)

    @functools.cached_property
    def task_windows(self) -> dict[str, int]:
        """Task name -> its window (ms)."""
        return {t: w for (t, _), w in zip(self.tasks, self.windows or [self.window_ms] * len(self.tasks))}

    @functools.cached_property
    def longest_ms(self) -> int:
        """The longest task window: an impression's window closes after it."""
        return max(self.task_windows.values(), default=self.window_ms)

    @property
    def close_ms(self) -> int:
        """How long after an impression its window closes, once ``wa`` passes it: the longest window and the
        allowed lateness."""
        return self.longest_ms + self.lateness_ms

    @property
    def horizon_ms(self) -> int:
        return self.longest_ms + self.lateness_ms + self.orphan_ms

    @functools.cached_property
    def task_names(self) -> list[str]:
        return [t for t, _ in self.tasks]

    @functools.cached_property
    def _by_action(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t, a in self.tasks:
            out.setdefault(a, []).append(t)
        return out

    def tasks_of(self, action_type: str) -> list[str]:
        return self._by_action.get(action_type, [])

    @functools.cached_property
    def _windows_by_action(self) -> dict[str, list[tuple[str, int]]]:
        return {a: [(t, self.task_windows[t]) for t in ts] for a, ts in self._by_action.items()}

    def windows_of(self, action_type: str) -> list[tuple[str, int]]:
        """``(task, window ms)`` of the tasks ``action_type`` labels."""
        return self._windows_by_action.get(action_type, [])


@dataclass(frozen=True)
class Action:
    request_id: str
    ts: int
    type: str
    value: float | None = None


@dataclass
class Example:
    """One labelled event: ``event`` is the impression with ``label`` (one task) or ``labels`` set, and
    ``feedback`` set to ``kind``."""

    request_id: str
    kind: str  # positive | negative | fake_negative
    event: dict[str, Any]


@dataclass
class JoinStats:
    impressions: int = 0  # impressions joined (first of their request_id, not late)
    duplicate_impressions: int = 0
    late_impressions: int = 0  # older than the dedupe horizon when they arrived: dropped
    actions: int = 0  # actions of a label type
    ignored_actions: int = 0  # actions of a type no task is labelled by
    duplicate_actions: int = 0  # a task's second counting action (or an identical waiting action)
    late_actions: int = 0  # in the window, but after the window closed in event time
    after_window_actions: int = 0  # later than the window after the impression
    orphan_actions: int = 0  # never matched an impression within join.orphan_wait_s
    examples: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    rows: int = 0  # state rows held (impressions, closed impressions kept for dedupe, waiting actions' keys)


_ACTION_KEYS = frozenset(("request_id", "ts", "type", "value"))


def parse_action(obj: Any) -> Action:
    """An action from its decoded JSON object, or ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"action must be a JSON object, got {type(obj).__name__}")
    if not obj.keys() <= _ACTION_KEYS:
        extra = sorted(set(obj) - _ACTION_KEYS)
        raise ValueError(f"unknown key {extra[0]!r} in an action; allowed: request_id, ts, type, value")
    rid = obj.get("request_id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise ValueError("action: request_id must be a non-empty string or an integer")
    ts = obj.get("ts")
    if type(ts) is not int or not -(2**63) <= ts < 2**63:
        raise ValueError(f"action: ts must be an integer (ms since epoch), got {ts!r}")
    typ = obj.get("type")
    if not isinstance(typ, str) or not typ:
        raise ValueError("action: type must be a non-empty string")
    value = obj.get("value")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        raise ValueError(f"action: value must be a finite number, got {value!r}")
    return Action(str(rid), ts, typ, None if value is None else float(value))


@runtime_checkable
class RawRows(Protocol):
    """A state store that hands its rows over as stored (JSON bytes), for a restore that reads only what the
    heaps need from each (:class:`~.txstore.TxStore`)."""

    def raw_items(self) -> Iterable[tuple[str, bytes]]: ...


@dataclass
class DueHeaps:
    """What :class:`JoinState` rebuilds from its stored rows at a restore: the due-time heaps (heapified)
    and the count of rows (impressions and lists of waiting actions)."""

    closing: list[tuple[int, str]] = field(default_factory=list)  # (close time, rid) of open impressions
    purge: list[tuple[int, str]] = field(default_factory=list)  # (dedupe horizon end, rid) of closed ones
    orphans: list[tuple[int, str]] = field(default_factory=list)  # (expiry, rid) of waiting actions
    rows: int = 0


def due_heaps(rules: JoinRules, items: Iterable[tuple[str, Any]],
              stopped: Callable[[], bool] | None = None) -> DueHeaps | None:
    """The :class:`DueHeaps` of a partition's stored ``(key, value)`` rows (values decoded or as stored);
    None when ``stopped()`` turned true on the way (asked every 256 rows)."""
    out = DueHeaps()
    for n, (key, val) in enumerate(items):
        if stopped is not None and not n & 255 and stopped():
            return None
        if key.startswith(IMPRESSION):
            out.rows += 1
            rid = key[2:]
            ts, is_open = impression_due(val)
            if is_open:
                out.closing.append((ts + rules.close_ms, rid))
            else:
                out.purge.append((ts + rules.horizon_ms, rid))
        elif key.startswith(WAITING):
            out.rows += 1
            for ats, _typ, _wa in decoded(val):
                out.orphans.append((ats + rules.orphan_ms, key[2:]))
    for h in (out.closing, out.purge, out.orphans):
        heapq.heapify(h)
    return out


class JoinState:
    """The join of one partition. ``store``: a mutable mapping from str keys to JSON-able values;
    ``on_delay``: called with each counting action's delay after its impression (ms)."""

    def __init__(self, rules: JoinRules, store: MutableMapping | None = None,
                 on_delay: Callable[[int], None] | None = None, heaps: DueHeaps | None = None):
        self.rules = rules
        self.store: MutableMapping = store if store is not None else {}
        self.stats = JoinStats()
        self.on_delay = on_delay
        self.wi: int | None = None
        self.wa: int | None = None
        self._closing: list[tuple[int, str]] = []  # (close time, rid) of open impressions
        self._purge: list[tuple[int, str]] = []  # (dedupe horizon end, rid) of closed impressions
        self._orphans: list[tuple[int, str]] = []  # (expiry, rid) of waiting actions
        self.restore(heaps)

    # -- state ---------------------------------------------------------------------------------------
    def restore(self, heaps: DueHeaps | None = None) -> None:
        """Read the watermarks and rebuild the due-time heaps from the store (after a restart); ``heaps``:
        the heaps of exactly the rows the store holds, read ahead (:mod:`.state_prescan`), used as given."""
        wm: WatermarkRow | None = self.store.get(WATERMARKS)
        self.wi, self.wa = (wm["i"], wm["a"]) if wm else (None, None)
        if heaps is None:
            # a store of serialised rows hands them over undecoded: an impression's event is not decoded
            rows = self.store.raw_items() if isinstance(self.store, RawRows) else list(self.store.items())
            heaps = due_heaps(self.rules, rows)
        self._closing, self._purge, self._orphans = heaps.closing, heaps.purge, heaps.orphans
        self.stats.rows = heaps.rows

    def _save_wm(self) -> None:
        self.store[WATERMARKS] = WatermarkRow(i=self.wi, a=self.wa)

    def _put(self, key: str, val: Any) -> None:
        if key not in self.store:
            self.stats.rows += 1
        self.store[key] = val

    def _del(self, key: str) -> None:
        if key in self.store:
            del self.store[key]
            self.stats.rows -= 1

    # -- output --------------------------------------------------------------------------------------
    def _example(self, rid: str, rec: ImpressionRow, kind: str, labels: dict[str, float | None]) -> Example:
        ev = dict(rec["ev"])
        if self.rules.single:
            ev["label"] = labels[self.rules.task_names[0]]
        else:
            ev["labels"] = labels
        ev["feedback"] = kind
        self.stats.examples[kind] += 1
        return Example(rid, kind, ev)

    # -- input ---------------------------------------------------------------------------------------
    def impression(self, rid: str, ts: int, event: dict[str, Any]) -> list[Example]:
        """One impression (``event``: the unlabelled event, ``ts`` its time); the examples it completes."""
        r = self.rules
        self.wi = ts if self.wi is None else max(self.wi, ts)
        self._save_wm()
        self._expire_orphans()
        out: list[Example] = self._close_due()
        self._purge_closed()
        if ts + r.horizon_ms < self.wi:
            self.stats.late_impressions += 1
            return out
        key = IMPRESSION + rid
        if key in self.store:
            self.stats.duplicate_impressions += 1
            return out
        self.stats.impressions += 1
        rec = ImpressionRow(ts=ts, wi=self.wi, ev=event, open=True, pos=[], done=False)
        if r.mode == "fake_negative":
            out.append(self._example(rid, rec, "fake_negative", {t: 0 for t in r.task_names}))
        waiting: list[WaitingAction] | None = self.store.get(WAITING + rid)
        if waiting:
            self._del(WAITING + rid)
            for ats, typ, wa in waiting:
                out += self._count(rid, rec, ats, typ, wa)
        if self.wa is not None and self.wa > ts + r.close_ms:
            out += self._close(rid, rec)
        else:
            heapq.heappush(self._closing, (ts + r.close_ms, rid))
        self.stats.rows += 1  # a new row: ``key`` is not in the store (checked above)
        self.store[key] = rec
        return out

    def action(self, action: Action) -> list[Example]:
        """One action; the examples it completes (its own positive, and negatives whose window it closed)."""
        r = self.rules
        self.wa = action.ts if self.wa is None else max(self.wa, action.ts)
        self._save_wm()
        out: list[Example] = []
        if not r.tasks_of(action.type):
            self.stats.ignored_actions += 1
        else:
            self.stats.actions += 1
            rid = action.request_id
            rec: ImpressionRow | None = self.store.get(IMPRESSION + rid)
            if rec is not None and rec["open"]:
                out += self._count(rid, rec, action.ts, action.type, self.wa)
                self.store[IMPRESSION + rid] = rec
            elif rec is not None:
                if all(action.ts > rec["ts"] + w for _, w in r.windows_of(action.type)):
                    self.stats.after_window_actions += 1
                else:
                    self.stats.late_actions += 1
            elif self.wi is not None and action.ts + r.orphan_ms < self.wi:
                self.stats.orphan_actions += 1  # its impression can no longer match it
            else:
                key = WAITING + rid
                waiting = list(self.store.get(key) or [])
                if any(ats == action.ts and typ == action.type for ats, typ, _ in waiting):
                    self.stats.duplicate_actions += 1
                else:
                    waiting.append([action.ts, action.type, self.wa])
                    self._put(key, waiting)
                    heapq.heappush(self._orphans, (action.ts + r.orphan_ms, rid))
        out += self._close_due()
        return out

    def advance(self, ms: int) -> list[Example]:
        """Move the partition's event time ``ms`` on without a record (the join task's idle timeout): both
        watermarks by ``ms`` (one not set yet starts from the other), then what is due closes, expires and is
        purged as after a record; the examples the closes write."""
        if ms <= 0 or (self.wi is None and self.wa is None):
            return []
        base = self.wi if self.wi is not None else self.wa
        self.wi = base + ms
        self.wa = (self.wa if self.wa is not None else base) + ms
        self._save_wm()
        self._expire_orphans()
        out = self._close_due()
        self._purge_closed()
        return out

    def holds_open(self) -> bool:
        """Whether an impression's window is open or an action waits for its impression: what moving event
        time on could close or expire (entries of the due-time heaps whose row is gone are dropped here)."""
        while self._closing:
            rec = self.store.get(IMPRESSION + self._closing[0][1])
            if rec is not None and rec["open"]:
                return True
            heapq.heappop(self._closing)
        while self._orphans:
            if self.store.get(WAITING + self._orphans[0][1]):
                return True
            heapq.heappop(self._orphans)
        return False

    # -- rules ---------------------------------------------------------------------------------------
    def _count(self, rid: str, rec: ImpressionRow, ats: int, typ: str, wa: int) -> list[Example]:
        """Apply one label-type action to an open impression ``rec`` (updated in place): it counts for each task
        of its type whose window holds it and has not closed in event time; an action that counts for none is
        after the window (it is past every such window) or late."""
        r = self.rules
        t = rec["ts"]
        windows = [(task, w) for task, w in r.windows_of(typ) if ats <= t + w]
        if not windows:
            self.stats.after_window_actions += 1
            return []
        tasks = [task for task, w in windows if wa <= t + w + r.lateness_ms]
        if not tasks:
            self.stats.late_actions += 1
            return []
        if ats + r.orphan_ms < rec["wi"]:
            self.stats.orphan_actions += 1
            return []
        out: list[Example] = []
        for task in tasks:
            if task in rec["pos"]:
                self.stats.duplicate_actions += 1
                continue
            rec["pos"].append(task)
            if self.on_delay is not None:
                self.on_delay(max(0, ats - t))
            if r.mode == "fake_negative":
                labels = {n: (1 if n == task else None) for n in r.task_names}
                out.append(self._example(rid, rec, "positive", labels))
            elif not rec["done"] and len(rec["pos"]) == len(r.tasks):
                rec["done"] = True
                out.append(self._example(rid, rec, "positive", {n: 1 for n in r.task_names}))
        return out

    def _close(self, rid: str, rec: ImpressionRow) -> list[Example]:
        """Close ``rec``'s window (updated in place): window mode's negative if it has no example yet. The
        closed row drops its event: no example of a closed impression is written, and the row stays only for
        dedupe until its horizon passes."""
        out: list[Example] = []
        rec["open"] = False
        if self.rules.mode == "window" and not rec["done"]:
            rec["done"] = True
            out.append(self._example(rid, rec, "negative",
                                     {n: (1 if n in rec["pos"] else 0) for n in self.rules.task_names}))
        rec.pop("ev", None)
        heapq.heappush(self._purge, (rec["ts"] + self.rules.horizon_ms, rid))
        return out

    def _close_due(self) -> list[Example]:
        """Close the open windows whose ``t + W + L`` (``W`` the longest task window) is below ``wa`` or below
        ``wi - O`` (``t + H < wi``)."""
        out: list[Example] = []
        due = [w for w in (self.wa, None if self.wi is None else self.wi - self.rules.orphan_ms) if w is not None]
        if not due:
            return out
        due_at = max(due)
        while self._closing and self._closing[0][0] < due_at:
            _, rid = heapq.heappop(self._closing)
            rec = self.store.get(IMPRESSION + rid)
            if rec is None or not rec["open"]:
                continue
            out += self._close(rid, rec)
            self.store[IMPRESSION + rid] = rec
        return out

    def _expire_orphans(self) -> None:
        r = self.rules
        while self._orphans and self._orphans[0][0] < self.wi:
            _, rid = heapq.heappop(self._orphans)
            key = WAITING + rid
            waiting = self.store.get(key)
            if not waiting:
                continue
            keep = [w for w in waiting if w[0] + r.orphan_ms >= self.wi]
            self.stats.orphan_actions += len(waiting) - len(keep)
            if keep:
                self.store[key] = keep
            else:
                self._del(key)

    def _purge_closed(self) -> None:
        while self._purge and self._purge[0][0] < self.wi:
            _, rid = heapq.heappop(self._purge)
            rec = self.store.get(IMPRESSION + rid)
            if rec is not None and not rec["open"] and rec["ts"] + self.rules.horizon_ms < self.wi:
                self._del(IMPRESSION + rid)


def encode_value(val: Any) -> bytes:
    return json.dumps(val, separators=(",", ":")).encode()


def decode_value(raw: bytes) -> Any:
    return json.loads(raw)
