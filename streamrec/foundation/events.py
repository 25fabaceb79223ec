"""The event contract and its columnar mini-batch form.

An event is one interaction: ``ts`` (ms), ``label``, ``dense`` (fixed width),
``sparse`` (field -> id or list of ids; ints or strings), optional ``user``,
``item``, ``request_id``, and optional ``labels`` (task name -> label or null) for a
model with several tasks: ``label`` is the first task's label, ``labels`` names them,
and a task without a label is masked (NaN), never 0. Batches are columnar: one jagged
id array per field (values + offsets, like TorchRec's KeyedJaggedTensor), a dense
matrix, labels (and a task-label matrix when the model has several tasks) and
timestamps, and the Kafka offsets they came from.

An event may carry its **feedback kind** (``"feedback"``: what the delayed-feedback joiner made
of it): ``"negative"``, ``"fake_negative"`` or ``"positive"``; absent, it is a plain labelled
event. In a batch the kinds are the int8 codes of :data:`FEEDBACK_CODES` (0 plain, 1 negative,
2 fake_negative, 3 positive), the one place those codes are defined.
"""

from __future__ import annotations

import itertools
import reprlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from .errors import EventError
from .ids import INT64_MAX, INT64_MIN, hash_id, hash_ids

if TYPE_CHECKING:
    from .model_config import ModelConfig

__all__ = ["DenseBound", "EventBatch", "EventError", "EventSchema", "JaggedIds", "hash_id", "hash_ids", "INT64_MAX",
           "INT64_MIN", "FLOAT32_MAX", "FEEDBACK_CODES", "FEEDBACK_NAMES", "FEEDBACK_PLAIN", "FEEDBACK_NEGATIVE",
           "FEEDBACK_FAKE_NEGATIVE", "FEEDBACK_POSITIVE", "feedback_code"]

_ALLOWED_KEYS = frozenset({"ts", "label", "labels", "dense", "sparse", "user", "item", "request_id", "feedback"})

# An event's feedback kind as an int8 code in EventBatch.feedback: 0 is a plain labelled event (no kind).
FEEDBACK_PLAIN, FEEDBACK_NEGATIVE, FEEDBACK_FAKE_NEGATIVE, FEEDBACK_POSITIVE = 0, 1, 2, 3
FEEDBACK_CODES: dict[str, int] = {"negative": FEEDBACK_NEGATIVE, "fake_negative": FEEDBACK_FAKE_NEGATIVE,
                                  "positive": FEEDBACK_POSITIVE}
FEEDBACK_NAMES: dict[int, str] = {c: k for k, c in FEEDBACK_CODES.items()}
FLOAT32_MAX = float(np.finfo(np.float32).max)
_SHORT = reprlib.Repr()  # a bad value in an error message: bounded in length and depth
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 60, 60, 60


class DenseBound(Protocol):
    """What the schema reads of the ingest section: the largest absolute dense value an event may carry."""

    dense_abs_max: float


def _show(x: Any) -> str:
    """``repr(x)`` for an error message, short whatever ``x`` is (deep nesting, huge strings or ints)."""
    try:
        return _SHORT.repr(x)
    except Exception:  # an int too long to print, a repr that raises...
        return f"<{type(x).__name__}>"


def feedback_code(kind: Any) -> int:
    """The code of a feedback kind (None: plain, 0), or EventError naming the allowed kinds."""
    if kind is None:
        return FEEDBACK_PLAIN
    code = FEEDBACK_CODES.get(kind) if isinstance(kind, str) else None
    if code is None:
        raise EventError(f"feedback must be one of {', '.join(FEEDBACK_CODES)} (or absent), got {_show(kind)}")
    return code


def _check_text(s: str, what: str) -> str:
    """``s`` if it is valid Unicode text (encodable as UTF-8), else EventError naming ``what``.

    Python strings may hold lone surrogates (the standard json module makes them of
    ``"\\ud800"`` escapes and of UTF-8-encoded surrogates, bytes ED A0 80): no stable
    bytes, and every later encode (logs, Kafka headers, gRPC) would fail on them.
    """
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EventError(f"{what} is not valid Unicode text (lone surrogate {s[e.start]!r} at {e.start})") from None
    return s


@dataclass(frozen=True)
class JaggedIds:
    """Variable-length id lists for one field over a batch: ``values[offsets[i]:offsets[i+1]]``."""

    values: np.ndarray  # int64 [N]
    offsets: np.ndarray  # int64 [B + 1]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def one_each(self) -> bool:
        """Whether every event has exactly one id (the usual layout: ``values[i]`` is event ``i``'s id).
        Computed once per object (its arrays are never changed in place)."""
        one = self.__dict__.get("_one_each")
        if one is None:
            n = len(self.offsets) - 1
            one = len(self.values) == n and bool(np.array_equal(self.offsets, np.arange(n + 1)))
            object.__setattr__(self, "_one_each", one)
        return one

    def take(self, rows: np.ndarray) -> "JaggedIds":
        """The id lists of the given batch rows, in that order."""
        if self.one_each():
            out = JaggedIds(self.values[rows], np.arange(len(rows) + 1, dtype=np.int64))
            object.__setattr__(out, "_one_each", True)
            return out
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[rows]
        idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return JaggedIds(self.values[idx], offsets)

    @staticmethod
    def concat(parts: Sequence["JaggedIds"]) -> "JaggedIds":
        values = np.concatenate([p.values for p in parts]) if parts else np.zeros(0, np.int64)
        lengths = np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return JaggedIds(values.astype(np.int64, copy=False), offsets)

    @staticmethod
    def from_lists(lists: Sequence[Sequence[int]]) -> "JaggedIds":
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((v for x in lists for v in x), dtype=np.int64, count=int(offsets[-1]))
        return JaggedIds(values, offsets)


@dataclass
class EventBatch:
    """A columnar mini-batch of events and where in Kafka they came from.

    ``labels`` is the first task's label, 0.0 where it is missing (what a
    single-task reader needs). ``task_labels`` (float32 [B, T], NaN = missing) holds
    every task's label; None means a single task whose labels are ``labels``.
    ``task_names`` names its columns (the model's tasks, in order) when known.
    ``feedback`` (int8 [B], :data:`FEEDBACK_CODES`, 0 = plain) is each event's feedback kind;
    None means every event is plain.

    ``source_offsets`` maps ``(topic, partition)`` to the offset *after* the last
    record in this batch from that partition: committing it marks the batch done.
    """

    ts: np.ndarray  # int64 [B]
    labels: np.ndarray  # float32 [B]
    dense: np.ndarray  # float32 [B, D]
    sparse: dict[str, JaggedIds]
    request_ids: list[str | None] | None = None
    source_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    source_newest_ms: int = 0  # newest Kafka record timestamp (ms) among its records: when it entered Kafka; 0 = unknown
    source_partitions: np.ndarray | None = None  # int32 [B]: each event's Kafka partition, when the consumer knows it
    source_records: np.ndarray | None = None  # int64 [B]: the offset of each event's Kafka record (with its partition)
    task_labels: np.ndarray | None = None  # float32 [B, T]: every task's label, NaN = missing; None: labels alone
    task_names: tuple[str, ...] | None = None  # the T tasks of task_labels' columns, when known
    feedback: np.ndarray | None = None  # int8 [B]: each event's feedback code (FEEDBACK_CODES); None: all plain

    def __len__(self) -> int:
        return len(self.labels)

    def label_matrix(self, num_tasks: int) -> np.ndarray:
        """Every task's label, float32 [B, num_tasks], NaN where missing.

        ``task_labels`` when the batch has it (its width must be ``num_tasks``); otherwise
        ``labels`` is the first task's and every other task is missing.
        """
        if self.task_labels is not None:
            if self.task_labels.shape[1] != num_tasks:
                raise ValueError(f"the batch has labels for {self.task_labels.shape[1]} tasks, not {num_tasks}")
            return self.task_labels
        out = np.full((len(self), num_tasks), np.nan, np.float32)
        if num_tasks:
            out[:, 0] = self.labels
        return out

    def task_events(self, t: int, num_tasks: int) -> "EventBatch":
        """The events that carry task ``t``'s label, as a one-task batch of that label (for a one-task model or
        reference of that task alone)."""
        import dataclasses

        m = self.label_matrix(num_tasks)
        rows = np.flatnonzero(~np.isnan(m[:, t]))
        return dataclasses.replace(self.take(rows), labels=m[rows, t].astype(np.float32), task_labels=None,
                                   task_names=None)

    def take(self, rows: np.ndarray) -> "EventBatch":
        """A sub-batch of the given rows (Kafka offsets are not carried over)."""
        return EventBatch(
            ts=self.ts[rows],
            labels=self.labels[rows],
            dense=self.dense[rows],
            sparse={k: v.take(rows) for k, v in self.sparse.items()},
            request_ids=[self.request_ids[i] for i in rows] if self.request_ids is not None else None,
            task_labels=self.task_labels[rows] if self.task_labels is not None else None,
            task_names=self.task_names,
            feedback=self.feedback[rows] if self.feedback is not None else None,
        )

    def feedback_codes(self) -> np.ndarray:
        """Every event's feedback code, int8 [B] (zeros when the batch has none)."""
        return self.feedback if self.feedback is not None else np.zeros(len(self), np.int8)

    @staticmethod
    def concat(parts: Sequence["EventBatch"], dense_dim: int, fields: Sequence[str]) -> "EventBatch":
        """One batch of ``parts`` in order. When any part has ``task_labels``, the result has them: a part
        without them contributes its ``labels`` as the first task's, the other tasks missing."""
        if not parts:
            return EventBatch.empty(dense_dim, fields)
        offsets: dict[tuple[str, int], int] = {}
        newest_ms = max(p.source_newest_ms for p in parts)
        for p in parts:
            for k, v in p.source_offsets.items():
                offsets[k] = max(offsets.get(k, 0), v)
        rids = None
        if any(p.request_ids is not None for p in parts):
            rids = [r for p in parts for r in (p.request_ids or [None] * len(p))]
        task_labels, names = None, None
        with_tasks = [p for p in parts if p.task_labels is not None]
        if with_tasks:
            width = with_tasks[0].task_labels.shape[1]
            names = next((p.task_names for p in with_tasks if p.task_names is not None), None)
            task_labels = np.concatenate([p.label_matrix(width) for p in parts])
        feedback = None
        if any(p.feedback is not None for p in parts):
            feedback = np.concatenate([p.feedback_codes() for p in parts])
        return EventBatch(
            ts=np.concatenate([p.ts for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            dense=np.concatenate([p.dense for p in parts]).reshape(sum(len(p) for p in parts), dense_dim),
            sparse={f: JaggedIds.concat([p.sparse[f] for p in parts]) for f in fields},
            request_ids=rids,
            source_offsets=offsets,
            source_newest_ms=newest_ms,
            source_partitions=np.concatenate([p.source_partitions for p in parts])
            if all(p.source_partitions is not None for p in parts) else None,
            source_records=np.concatenate([p.source_records for p in parts])
            if all(p.source_records is not None for p in parts) else None,
            task_labels=task_labels,
            task_names=names,
            feedback=feedback,
        )

    @staticmethod
    def empty(dense_dim: int, fields: Sequence[str], tasks: Sequence[str] = ("click",)) -> "EventBatch":
        """No events; with several ``tasks`` it has an empty [0, T] ``task_labels``."""
        z = np.zeros(1, dtype=np.int64)
        return EventBatch(
            ts=np.zeros(0, np.int64),
            labels=np.zeros(0, np.float32),
            dense=np.zeros((0, dense_dim), np.float32),
            sparse={f: JaggedIds(np.zeros(0, np.int64), z) for f in fields},
            task_labels=np.zeros((0, len(tasks)), np.float32) if len(tasks) > 1 else None,
            task_names=tuple(tasks) if len(tasks) > 1 else None,
        )

    def to_events(self, tasks: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Back to plain event dicts (ids as ints); for tests and the JSON codec.

        With ``task_labels``, each event has ``labels`` holding only its present tasks (named by
        ``tasks``, else ``task_names``) and ``label`` only when its first task's label is present.
        """
        names = None
        if self.task_labels is not None:
            names = tuple(tasks) if tasks is not None else self.task_names
            if names is None or len(names) != self.task_labels.shape[1]:
                raise ValueError(f"task_labels has {self.task_labels.shape[1]} columns; to_events needs their "
                                 f"task names (got {names!r})")
            present = ~np.isnan(self.task_labels)
        out = []
        for i in range(len(self)):
            ev: dict[str, Any] = {"ts": int(self.ts[i])}
            if names is None:
                ev["label"] = float(self.labels[i])
            else:
                row = self.task_labels[i]
                if present[i, 0]:
                    ev["label"] = float(row[0])
                ev["labels"] = {t: float(row[k]) for k, t in enumerate(names) if present[i, k]}
            ev["dense"] = [float(x) for x in self.dense[i]]
            ev["sparse"] = {f: [int(x) for x in j.row(i)] for f, j in self.sparse.items()}
            if self.request_ids is not None and self.request_ids[i] is not None:
                ev["request_id"] = self.request_ids[i]
            if self.feedback is not None and self.feedback[i]:
                ev["feedback"] = FEEDBACK_NAMES[int(self.feedback[i])]
            out.append(ev)
        return out


@dataclass(frozen=True)
class EventSchema:
    """What a valid event looks like for one model config: field names, dense width and task names."""

    fields: tuple[str, ...]
    dense_dim: int
    require_label: bool = True
    dense_abs_max: float = FLOAT32_MAX  # |dense value| above this is refused (config: ingest.dense_abs_max)
    tasks: tuple[str, ...] = ("click",)  # the model's tasks in output order; an event's ``label`` is the first's

    @classmethod
    def from_sections(cls, model: ModelConfig, ingest: DenseBound, require_label: bool = True) -> "EventSchema":
        """The schema of ``model``'s events, refusing dense values beyond ``ingest.dense_abs_max``."""
        return cls(tuple(model.field_names), model.dense_dim, require_label, float(ingest.dense_abs_max),
                   tuple(model.task_names))

    def validate(self, ev: Any) -> tuple[int, float, list[float], dict[str, list[int]], str | None,
                                         tuple[float, ...] | None, int]:
        """Check one decoded JSON event; return its normalised parts or raise EventError.

        The parts: ``(ts, label, dense, ids, request_id, task_labels, feedback)`` (``feedback``: the
        event's :data:`FEEDBACK_CODES` code, 0 when it has none). ``label`` is the
        first task's label (0.0 when missing); ``task_labels`` is every task's label in
        task order (NaN = missing), or None when the event has only the single-task form
        and the model one task. Written for speed (it runs once per JSON record): common
        cases take the shortest path (an event without ``labels`` pays nothing for it),
        everything unusual falls through to an exact check.
        """
        if type(ev) is not dict:
            if not isinstance(ev, Mapping):
                raise EventError(f"event must be a JSON object, got {type(ev).__name__}")
            ev = dict(ev)
        if not ev.keys() <= _ALLOWED_KEYS:
            extra = sorted(set(ev) - _ALLOWED_KEYS)
            raise EventError(f"unknown key {extra[0]!r}; allowed: {', '.join(sorted(_ALLOWED_KEYS))}")
        ts = ev.get("ts", 0)
        if type(ts) is not int or not INT64_MIN <= ts <= INT64_MAX:  # beyond int64 the batch build overflowed
            raise EventError(f"ts must be an integer (ms since epoch) within int64, got {_show(ts)}")
        label, task = self._labels_of(ev)
        dense = ev.get("dense")
        if dense is None:
            dense = []
        elif type(dense) is not list:
            raise EventError("dense must be a list of numbers")
        if len(dense) != self.dense_dim:
            raise EventError(f"dense has {len(dense)} values, the model expects {self.dense_dim}")
        bound = self.dense_abs_max
        for x in dense:
            tx = type(x)
            if tx is not float and tx is not int:
                raise EventError("dense must be a list of numbers")
            if not -bound <= x <= bound:  # NaN, inf or huge values would poison training
                raise EventError(f"dense values must be finite numbers within +-{bound:g} "
                                 f"(ingest.dense_abs_max), got {_show(x)}")
        ids = self._ids_of(ev)
        rid = ev.get("request_id")
        if rid is not None:
            if isinstance(rid, str):
                _check_text(rid, "request_id")
            elif isinstance(rid, (int, float)):  # a number: its text, as ever
                rid = str(rid)
            else:
                raise EventError(f"request_id must be a string or a number, got {type(rid).__name__}")
        fb = ev.get("feedback")
        return ts, label, dense, ids, rid, task, (0 if fb is None else feedback_code(fb))

    def _labels_of(self, ev: dict) -> tuple[float, tuple[float, ...] | None]:
        """The first task's label (0.0 when missing) and every task's (NaN = missing; None for a single-task
        event of a single-task model) of an event's ``label`` and ``labels``, or EventError."""
        label = ev.get("label")
        labels = ev.get("labels")  # null: no task labels, as an absent key (as for dense and sparse)
        if labels is not None:
            return self._task_labels(labels, label)
        if label is None:
            if self.require_label:
                raise EventError("missing label")
            return 0.0, (self._no_labels if len(self.tasks) > 1 else None)
        tl = type(label)
        if tl is not float and tl is not int:
            if tl is bool:
                label = float(label)
            else:
                raise EventError(f"label must be a number in [0, 1], got {_show(label)}")
        if not 0.0 <= label <= 1.0:  # also rejects NaN
            raise EventError(f"label must be a number in [0, 1], got {_show(label)}")
        label = float(label)
        return label, ((label,) + self._no_labels[1:] if len(self.tasks) > 1 else None)

    def _ids_of(self, ev: dict) -> dict[str, list[int]]:
        """Every model field's ids (ints as they are, strings hashed; an absent field has none) of an event's
        ``sparse`` object and its top-level ``user``/``item``, or EventError."""
        sparse = ev.get("sparse")
        if sparse is None:
            sparse = {}
        elif type(sparse) is not dict and not isinstance(sparse, Mapping):  # a JSON object: no ABC check
            raise EventError("sparse must be an object mapping field name to id or list of ids")
        fields = self.fields
        if "user" in ev or "item" in ev:
            sparse = dict(sparse)
            for opt in ("user", "item"):
                if opt in ev and opt in fields and opt not in sparse:
                    sparse[opt] = ev[opt]
        if not sparse.keys() <= self._field_set:
            unknown = sorted(set(sparse) - self._field_set)
            raise EventError(f"unknown sparse field {unknown[0]!r}; model fields: {', '.join(fields)}")
        ids: dict[str, list[int]] = {}
        for f in fields:
            v = sparse.get(f)
            if v is None:
                ids[f] = []
                continue
            vs = v if type(v) is list else [v]
            out = []
            for x in vs:
                if type(x) is int and INT64_MIN <= x <= INT64_MAX:
                    out.append(x)
                elif isinstance(x, (list, dict, tuple)):  # said here: hash_id would print all of it
                    raise EventError(f"sparse field {f!r}: an id must be an int or a string, "
                                     f"got a {type(x).__name__}")
                else:
                    try:
                        out.append(hash_id(x))
                    except EventError as e:
                        raise EventError(f"sparse field {f!r}: {e}") from None
            ids[f] = out
        return ids

    def _task_labels(self, labels: Any, label: Any) -> tuple[float, tuple[float, ...]]:
        """The first task's label (0.0 when missing) and every task's (NaN = missing) of an event's
        ``labels`` object and its ``label`` (None when absent), or EventError."""
        tasks = self.tasks
        if not isinstance(labels, Mapping):
            raise EventError(f"labels must be an object mapping task name to a number in [0, 1] or null, "
                             f"got {type(labels).__name__}")
        out = list(self._no_labels)
        for name, v in labels.items():
            k = self._task_index.get(name) if isinstance(name, str) else None
            if k is None:
                raise EventError(f"labels: unknown task {_show(name)}; model tasks: {', '.join(tasks)}")
            if v is None:
                continue
            tv = type(v)
            if tv is bool:
                v = float(v)
            elif tv is not float and tv is not int:
                raise EventError(f"labels: {name!r} must be a number in [0, 1] or null, got {_show(v)}")
            if not 0.0 <= v <= 1.0:  # also rejects NaN
                raise EventError(f"labels: {name!r} must be a number in [0, 1] or null, got {_show(v)}")
            out[k] = float(v)
        if label is not None:
            tl = type(label)
            if tl is bool:
                label = float(label)
            elif (tl is not float and tl is not int) or not 0.0 <= label <= 1.0:
                raise EventError(f"label must be a number in [0, 1], got {_show(label)}")
            first = out[0]
            if first != first:  # NaN: the first task's label is given by ``label`` alone
                out[0] = float(label)
            elif first != label:
                raise EventError(f"label ({_show(label)}) and labels[{tasks[0]!r}] ({_show(first)}) disagree; "
                                 f"label is the first task's label")
        if self.require_label and all(x != x for x in out):
            raise EventError(f"missing label: no task has one (model tasks: {', '.join(tasks)})")
        first = out[0]
        return (0.0 if first != first else first), tuple(out)

    @property
    def _no_labels(self) -> tuple[float, ...]:
        """Every task's label missing (NaN)."""
        t = self.__dict__.get("_nl")
        if t is None:
            t = (float("nan"),) * len(self.tasks)
            object.__setattr__(self, "_nl", t)
        return t

    @property
    def _task_index(self) -> dict[str, int]:
        ti = self.__dict__.get("_ti")
        if ti is None:
            ti = {t: k for k, t in enumerate(self.tasks)}
            object.__setattr__(self, "_ti", ti)
        return ti

    @property
    def _field_set(self) -> frozenset[str]:
        fs = self.__dict__.get("_fs")
        if fs is None:
            fs = frozenset(self.fields)
            object.__setattr__(self, "_fs", fs)
        return fs

    def batch_from_events(self, events: Iterable[Any]) -> EventBatch:
        """Validate plain event dicts into one batch; raises EventError on the first bad one."""
        return self.batch_from_parsed([self.validate(ev) for ev in events])

    def batch_from_parsed(self, rows: Sequence[tuple]) -> EventBatch:
        """Build one columnar batch from :meth:`validate` results (flat lists, one numpy call per column).

        The batch has ``task_labels`` when the model has several tasks or any event named its tasks.
        """
        n = len(rows)
        ts = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
        labels = np.fromiter((r[1] for r in rows), dtype=np.float32, count=n)
        task_labels = None
        num_tasks = len(self.tasks)
        if num_tasks > 1 or any(len(r) > 5 and r[5] is not None for r in rows):
            per_row = [r[5] if len(r) > 5 else None for r in rows]
            if all(t is not None for t in per_row):
                task_labels = np.array(per_row, dtype=np.float32).reshape(n, num_tasks)
            else:
                task_labels = np.full((n, num_tasks), np.nan, np.float32)
                for i, t in enumerate(per_row):
                    if t is not None:
                        task_labels[i] = t
                    else:  # only ``label`` (or a row built by hand): the first task's
                        task_labels[i, 0] = labels[i]
        if self.dense_dim:
            dense = np.asarray([r[2] for r in rows], dtype=np.float32).reshape(n, self.dense_dim)
        else:
            dense = np.zeros((n, 0), np.float32)
        sparse = {}
        for f in self.fields:
            lists = [r[3][f] for r in rows]
            lengths = np.fromiter(map(len, lists), dtype=np.int64, count=n)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            if bool((lengths == 1).all()):  # single-valued: one id per event (a total of n alone is not enough)
                values = np.fromiter((x[0] for x in lists), dtype=np.int64, count=n)
            else:
                values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(offsets[-1]))
            sparse[f] = JaggedIds(values, offsets)
        rids = [r[4] for r in rows]
        feedback = None
        if any(len(r) > 6 and r[6] for r in rows):
            feedback = np.fromiter((r[6] if len(r) > 6 else 0 for r in rows), dtype=np.int8, count=n)
        return EventBatch(
            ts=ts,
            labels=labels,
            dense=dense,
            sparse=sparse,
            request_ids=rids if any(r is not None for r in rids) else None,
            task_labels=task_labels,
            task_names=self.tasks if task_labels is not None else None,
            feedback=feedback,
        )
