"""A snapshot's quality evidence: what the trainer saw while it trained the version (manifest ``evidence``).

The block is declared by :class:`Evidence` (its windows :class:`Figures`, its input :class:`InputHealth`):
the trainer builds one and writes ``Evidence.to_block()`` into the manifest; serving reads it back with
:func:`read_evidence`. ``format`` is the block's version: a reader refuses a version it does not know.

Serving's promotion guard decides from this block alone whether a version may reach users, so it is checked
like the rest of the manifest (types, ranges, sizes) before a byte of the snapshot is stored. It arrives
inside an authenticated push: a forged block needs the push token like any other push.

Shape (``format`` 1)::

    {"format": 1,
     "since_previous": WINDOW,   # the events scored since the previous snapshot
     "recent": WINDOW,           # the last ``trainer.evidence_events`` events scored (a longer window)
     "sample": SAMPLE,           # optional: a few labelled events of the since-previous window
     "field_contribution": {field: CONTRIBUTION},  # optional: each field's share of the ranking (below)
     "input": {"records": n,                     # events that reached the trainer since the previous snapshot
               "dead_letters": n,                # records dead-lettered meanwhile
               "dead_letter_share": x,           # dead_letters / (records + dead_letters)
               "dense_zero_share": x,            # events whose dense vector is all zeros (0 when dense_dim is 0)
               "dense_column_zero_share": [x],   # per dense column: events where it is exactly 0
               "field_empty_share": {field: x},  # per field: events with no id
               "field_novel_share": {field: x}}} # per field: distinct ids not in the trainer's recent memory of ids

    WINDOW = {"events": n, "auc": x|null, "logloss": x|null, "label_rate": x|null, "mean_prediction": x|null,
              "positives": n|null,       # events labelled 1 (events - positives are labelled 0)
              "logloss_var": x|null,     # the variance of the per-event logloss over the window
              "tasks": {task: {"events", "auc", "logloss", "label_rate", "mean_prediction", ...}}}

    CONTRIBUTION = {"contribution": x,   # AUC of the model minus its AUC with the field's ids removed
                    "se": x,             # the standard error of that paired difference (DeLong)
                    "events": n}         # the labelled events it was measured on

    SAMPLE = {"labels": [y],                     # the first task's label of each event, 0 or 1
              "dense": [[x]],                    # each event's dense vector
              "ids": {field: [[id]]}}            # per field, each event's ids

The top-level window figures are the first task's; ``tasks`` holds every task's. A figure is null when it
cannot be computed (no labelled event, one class only for AUC). Calibration is ``mean_prediction /
label_rate``. ``positives`` and ``logloss_var`` give the window's sampling error (the guard scales its
margins by it); a block without them (an older trainer's) reads as null and is judged on the margins alone.
``sample`` is what serving's golden set is built from (events of windows whose versions it promoted); a block
without it adds nothing to the golden set. ``field_contribution`` is measured on a sample of the
since-previous window's events before the model trained on them, each event scored as it is and with one
field's ids removed; a block without it (an older trainer's, a trainer group's) reads as empty and the guard
skips the check that reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .errors import SnapshotError

EVIDENCE_FORMAT = 1
MAX_NAMES = 4096  # fields, tasks or dense columns one evidence block may name
MAX_NAME_CHARS = 128
WINDOW_KEYS = ("events", "auc", "logloss", "label_rate", "mean_prediction", "positives", "logloss_var")
SAMPLE_KEYS = ("labels", "dense", "ids")
CONTRIBUTION_KEYS = ("contribution", "se", "events")
MAX_SAMPLE_EVENTS = 1024  # events one evidence sample may hold
MAX_SAMPLE_IDS = 1 << 16  # ids one evidence sample may hold, all fields and events together
INT64 = (-(1 << 63), (1 << 63) - 1)
INPUT_KEYS = ("records", "dead_letters", "dead_letter_share", "dense_zero_share", "dense_column_zero_share",
              "field_empty_share", "field_novel_share")
MAX_LOGLOSS = 1e3  # a logloss above this is not a figure of a probability model (scores are clipped)


def _bad(key: str, msg: str):
    raise SnapshotError(f"manifest.evidence.{key}: {msg}", code="INVALID_ARGUMENT")


def _count(v: Any, key: str) -> int:
    if type(v) is not int or not 0 <= v < 1 << 62:
        _bad(key, f"must be a non-negative integer, got {v!r}")
    return v


def _share(v: Any, key: str, null: bool = False) -> None:
    if v is None and null:
        return
    if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= 1:
        _bad(key, f"must be a number in [0, 1]{' or null' if null else ''}, got {v!r}")


def _window_figures(w: Any, key: str) -> None:
    if not isinstance(w, dict):
        _bad(key, "must be an object")
    extra = sorted(set(w) - set(WINDOW_KEYS) - {"tasks"})
    if extra:
        _bad(key, f"unknown key {extra[0]!r}")
    _count(w.get("events"), f"{key}.events")
    if w.get("positives") is not None and _count(w["positives"], f"{key}.positives") > w["events"]:
        _bad(f"{key}.positives", f"{w['positives']} is more than the window's {w['events']} events")
    var = w.get("logloss_var")
    if var is not None and (type(var) not in (int, float) or not math.isfinite(var) or not 0 <= var <= MAX_LOGLOSS**2):
        _bad(f"{key}.logloss_var", f"must be a number in [0, {MAX_LOGLOSS**2:g}] or null, got {var!r}")
    for k in ("auc", "label_rate", "mean_prediction"):
        _share(w.get(k), f"{key}.{k}", null=True)
    ll = w.get("logloss")
    if ll is not None and (type(ll) not in (int, float) or not math.isfinite(ll) or not 0 <= ll <= MAX_LOGLOSS):
        _bad(f"{key}.logloss", f"must be a number in [0, {MAX_LOGLOSS:g}] or null, got {ll!r}")


def _names(d: Any, key: str) -> dict:
    if not isinstance(d, dict):
        _bad(key, "must be an object")
    if len(d) > MAX_NAMES:
        _bad(key, f"{len(d)} entries, the limit is {MAX_NAMES}")
    for name in d:
        if not 0 < len(name) <= MAX_NAME_CHARS:
            _bad(key, f"name {name[:40]!r} must be 1-{MAX_NAME_CHARS} characters")
    return d


def _check_sample(sm: Any) -> None:
    if not isinstance(sm, dict):
        _bad("sample", "must be an object")
    extra = sorted(set(sm) - set(SAMPLE_KEYS))
    if extra:
        _bad(f"sample.{extra[0]}", "unknown key")
    labels, dense, ids = sm.get("labels"), sm.get("dense"), sm.get("ids")
    if not isinstance(labels, list) or len(labels) > MAX_SAMPLE_EVENTS:
        _bad("sample.labels", f"must be a list of at most {MAX_SAMPLE_EVENTS} labels")
    if any(y not in (0, 1) or type(y) is bool for y in labels):
        _bad("sample.labels", "each label must be 0 or 1")
    n = len(labels)
    if not isinstance(dense, list) or len(dense) != n:
        _bad("sample.dense", f"must be a list of {n} dense vectors (one per label)")
    width = len(dense[0]) if n and isinstance(dense[0], list) else 0
    for row in dense:
        if not isinstance(row, list) or len(row) != width or width > MAX_NAMES or not all(
                type(x) in (int, float) and math.isfinite(x) for x in row):
            _bad("sample.dense", f"each event's dense vector must be a list of {width} finite numbers")
    total = 0
    for name, lists in _names(ids, "sample.ids").items():
        if not isinstance(lists, list) or len(lists) != n:
            _bad(f"sample.ids.{name}", f"must be a list of {n} id lists (one per label)")
        for one in lists:
            if not isinstance(one, list) or not all(type(i) is int and INT64[0] <= i <= INT64[1] for i in one):
                _bad(f"sample.ids.{name}", "each event's ids must be a list of 64-bit integers")
            total += len(one)
        if total > MAX_SAMPLE_IDS:
            _bad("sample.ids", f"more than {MAX_SAMPLE_IDS} ids")


def _check_contribution(fc: Any) -> None:
    for name, c in _names(fc, "field_contribution").items():
        key = f"field_contribution.{name}"
        if not isinstance(c, dict) or sorted(c) != sorted(CONTRIBUTION_KEYS):
            _bad(key, f"must be an object of exactly {', '.join(CONTRIBUTION_KEYS)}")
        x, se = c["contribution"], c["se"]
        if type(x) not in (int, float) or not math.isfinite(x) or not -1 <= x <= 1:
            _bad(f"{key}.contribution", f"must be a number in [-1, 1], got {x!r}")
        if type(se) not in (int, float) or not math.isfinite(se) or not 0 <= se <= 1:
            _bad(f"{key}.se", f"must be a number in [0, 1], got {se!r}")
        _count(c["events"], f"{key}.events")


def check_evidence(ev: Any) -> None:
    """Raise ``SnapshotError`` (INVALID_ARGUMENT) naming the first key of ``ev`` of a wrong type or range."""
    if not isinstance(ev, dict):
        raise SnapshotError(f"manifest.evidence: must be an object or null, got {type(ev).__name__}",
                            code="INVALID_ARGUMENT")
    extra = sorted(set(ev) - {"format", "since_previous", "recent", "input", "sample", "field_contribution"})
    if extra:
        _bad(extra[0], "unknown key")
    if ev.get("format") != EVIDENCE_FORMAT:
        _bad("format", f"{ev.get('format')!r} is not supported (expected {EVIDENCE_FORMAT})")
    for win in ("since_previous", "recent"):
        w = ev.get(win)
        _window_figures(w, win)
        for task, f in _names(w.get("tasks", {}), f"{win}.tasks").items():
            _window_figures(f, f"{win}.tasks.{task}")
            if "tasks" in f:
                _bad(f"{win}.tasks.{task}", "unknown key 'tasks'")
    if ev.get("sample") is not None:
        _check_sample(ev["sample"])
    if ev.get("field_contribution") is not None:
        _check_contribution(ev["field_contribution"])
    inp = ev.get("input")
    if not isinstance(inp, dict):
        _bad("input", "must be an object")
    extra = sorted(set(inp) - set(INPUT_KEYS))
    if extra:
        _bad(f"input.{extra[0]}", "unknown key")
    _count(inp.get("records"), "input.records")
    _count(inp.get("dead_letters"), "input.dead_letters")
    for k in ("dead_letter_share", "dense_zero_share"):
        _share(inp.get(k), f"input.{k}")
    cols = inp.get("dense_column_zero_share", [])
    if not isinstance(cols, list) or len(cols) > MAX_NAMES:
        _bad("input.dense_column_zero_share", f"must be a list of at most {MAX_NAMES} shares")
    for i, x in enumerate(cols):
        _share(x, f"input.dense_column_zero_share[{i}]")
    for k in ("field_empty_share", "field_novel_share"):
        for name, x in _names(inp.get(k, {}), f"input.{k}").items():
            _share(x, f"input.{k}.{name}")


@dataclass(frozen=True)
class Figures:
    """One window's figures (``WINDOW`` above); ``tasks`` (top-level windows only) holds every task's."""

    events: int = 0
    auc: float | None = None
    logloss: float | None = None
    label_rate: float | None = None
    mean_prediction: float | None = None
    tasks: Mapping[str, "Figures"] = field(default_factory=dict)
    positives: int | None = None  # events labelled 1 (None: not recorded, an older trainer's block)
    logloss_var: float | None = None  # the per-event logloss's variance over the window (None: not recorded)

    def to_block(self) -> dict[str, Any]:
        w: dict[str, Any] = {"events": int(self.events), "auc": self.auc, "logloss": self.logloss,
                             "label_rate": self.label_rate, "mean_prediction": self.mean_prediction}
        if self.positives is not None:
            w["positives"] = int(self.positives)
        if self.logloss_var is not None:
            w["logloss_var"] = float(self.logloss_var)
        if self.tasks:
            w["tasks"] = {name: f.to_block() for name, f in self.tasks.items()}
        return w

    @classmethod
    def from_block(cls, w: Mapping[str, Any]) -> "Figures":
        return cls(int(w["events"]), w.get("auc"), w.get("logloss"), w.get("label_rate"), w.get("mean_prediction"),
                   {name: cls.from_block(f) for name, f in (w.get("tasks") or {}).items()}, w.get("positives"),
                   w.get("logloss_var"))

    @property
    def labelled(self) -> tuple[int, int] | None:
        """(positives, negatives) of the window: recorded, else derived from the label rate (an older
        trainer's block); None without either."""
        pos = self.positives
        if pos is None and self.label_rate is not None:
            pos = int(round(self.label_rate * self.events))
        return None if pos is None else (int(pos), int(self.events) - int(pos))


@dataclass(frozen=True)
class Contribution:
    """A field's contribution to the model's ranking on a window (``CONTRIBUTION`` above): the model's AUC
    minus its AUC with the field's ids removed, on the same ``events``, and that paired difference's
    standard error."""

    contribution: float
    se: float
    events: int

    def to_block(self) -> dict[str, Any]:
        return {"contribution": float(self.contribution), "se": float(self.se), "events": int(self.events)}


@dataclass(frozen=True)
class EventSample:
    """A few labelled events of a window (``SAMPLE`` above), as plain values: the first task's label, the
    dense vector and per field the ids of each event."""

    labels: tuple[int, ...] = ()
    dense: tuple[tuple[float, ...], ...] = ()
    ids: Mapping[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    def to_block(self) -> dict[str, Any]:
        return {"labels": [int(y) for y in self.labels], "dense": [[float(x) for x in row] for row in self.dense],
                "ids": {name: [[int(i) for i in one] for one in lists] for name, lists in self.ids.items()}}

    @classmethod
    def from_block(cls, sm: Mapping[str, Any]) -> "EventSample":
        return cls(tuple(int(y) for y in sm["labels"]), tuple(tuple(float(x) for x in row) for row in sm["dense"]),
                   {name: tuple(tuple(one) for one in lists) for name, lists in sm["ids"].items()})


@dataclass(frozen=True)
class InputHealth:
    """The input's health since the previous snapshot (``input`` above)."""

    records: int = 0
    dead_letters: int = 0
    dead_letter_share: float = 0.0
    dense_zero_share: float = 0.0
    dense_column_zero_share: tuple[float, ...] = ()
    field_empty_share: Mapping[str, float] = field(default_factory=dict)
    field_novel_share: Mapping[str, float] = field(default_factory=dict)

    def to_block(self) -> dict[str, Any]:
        return {"records": int(self.records), "dead_letters": int(self.dead_letters),
                "dead_letter_share": float(self.dead_letter_share), "dense_zero_share": float(self.dense_zero_share),
                "dense_column_zero_share": [float(x) for x in self.dense_column_zero_share],
                "field_empty_share": {k: float(v) for k, v in self.field_empty_share.items()},
                "field_novel_share": {k: float(v) for k, v in self.field_novel_share.items()}}

    @classmethod
    def from_block(cls, inp: Mapping[str, Any]) -> "InputHealth":
        return cls(int(inp["records"]), int(inp["dead_letters"]), float(inp["dead_letter_share"]),
                   float(inp["dense_zero_share"]), tuple(float(x) for x in inp.get("dense_column_zero_share") or ()),
                   dict(inp.get("field_empty_share") or {}), dict(inp.get("field_novel_share") or {}))


@dataclass(frozen=True)
class Evidence:
    """A snapshot's evidence block as a value: the trainer builds one, :meth:`to_block` is the manifest's form,
    :func:`read_evidence` the reader's way back. ``format`` is the block's version (:data:`EVIDENCE_FORMAT`)."""

    since_previous: Figures
    recent: Figures
    input: InputHealth = field(default_factory=InputHealth)
    format: int = EVIDENCE_FORMAT
    sample: EventSample | None = None  # a few labelled events of the since-previous window (None: none taken)
    field_contribution: Mapping[str, Contribution] = field(default_factory=dict)  # per field (empty: not measured)

    def to_block(self) -> dict[str, Any]:
        """The manifest's ``evidence`` object (checked by :func:`check_evidence`)."""
        ev = {"format": self.format, "since_previous": self.since_previous.to_block(),
              "recent": self.recent.to_block(), "input": self.input.to_block()}
        if self.sample is not None:
            ev["sample"] = self.sample.to_block()
        if self.field_contribution:
            ev["field_contribution"] = {name: c.to_block() for name, c in self.field_contribution.items()}
        check_evidence(ev)
        return ev


def read_evidence(block: Mapping[str, Any] | None) -> Evidence | None:
    """The :class:`Evidence` of a manifest's ``evidence`` object (None: the snapshot carries none); a block of
    a wrong type, range or version raises ``SnapshotError`` (INVALID_ARGUMENT) as :func:`check_evidence`."""
    if block is None:
        return None
    check_evidence(block)
    return Evidence(Figures.from_block(block["since_previous"]), Figures.from_block(block["recent"]),
                    InputHealth.from_block(block["input"]), int(block["format"]),
                    EventSample.from_block(block["sample"]) if block.get("sample") is not None else None,
                    {name: Contribution(float(c["contribution"]), float(c["se"]), int(c["events"]))
                     for name, c in (block.get("field_contribution") or {}).items()})


def input_health(records: int = 0, dead_letters: int = 0, dense_zero_share: float = 0.0,
                 dense_column_zero_share: Sequence[float] = (), field_empty_share: Mapping[str, float] | None = None,
                 field_novel_share: Mapping[str, float] | None = None) -> InputHealth:
    """The input's health from its counts: ``dead_letter_share`` is derived from ``records`` and ``dead_letters``."""
    total = records + dead_letters
    return InputHealth(int(records), int(dead_letters), (dead_letters / total) if total else 0.0,
                       float(dense_zero_share), tuple(float(x) for x in dense_column_zero_share),
                       dict(field_empty_share or {}), dict(field_novel_share or {}))


def window(events: int = 0, auc: float | None = None, logloss: float | None = None,
           label_rate: float | None = None, mean_prediction: float | None = None,
           tasks: Mapping[str, Figures] | None = None, positives: int | None = None,
           logloss_var: float | None = None) -> Figures:
    """One window's figures."""
    return Figures(int(events), auc, logloss, label_rate, mean_prediction, dict(tasks or {}), positives, logloss_var)


def make_evidence(since_previous: Figures, recent: Figures, records: int = 0, dead_letters: int = 0,
                  dense_zero_share: float = 0.0, dense_column_zero_share: Sequence[float] | None = None,
                  field_empty_share: Mapping[str, float] | None = None,
                  field_novel_share: Mapping[str, float] | None = None,
                  sample: EventSample | None = None,
                  field_contribution: Mapping[str, Contribution] | None = None) -> dict[str, Any]:
    """An evidence block (the manifest's form) from its parts (a hand-made snapshot's, a test's)."""
    return Evidence(since_previous, recent, input_health(records, dead_letters, dense_zero_share,
                                                         dense_column_zero_share or (), field_empty_share,
                                                         field_novel_share), sample=sample,
                    field_contribution=dict(field_contribution or {})).to_block()


def empty_evidence() -> dict[str, Any]:
    """The evidence of a snapshot written with no events seen since the previous one (a test's or a tool's
    hand-made snapshot): no figure to judge, so the guard passes it; the push still needs its token."""
    return Evidence(Figures(), Figures()).to_block()
