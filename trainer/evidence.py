"""The quality evidence each snapshot carries (``manifest.evidence``, ``streamrec.snapshot.evidence``).

:class:`EvidenceCollector` watches what the trainer scores and what arrives at it: per task the progressive
labels and scores (scored before the model trains on them, so they measure the model on data it has not
seen) over the events since the previous snapshot and over the last ``trainer.metrics_window`` events, and
the input's health over the events since the previous snapshot: the share of all-zero dense vectors, per
dense column the share of zeros, per field the share of events with no id and of the distinct ids of each
batch that are not in the trainer's
recent memory of that field's ids (two rotating bitsets of hashed ids: an id counts as seen while its bit is
set in either; the checkpoint keeps it, so a restarted trainer's first window does not count every
id as new), and the dead-lettered records (the consumer's counter, passed in). Each window's figures carry its positive
count and the per-event logloss's variance (serving's guard scales its margins by the window's sampling
error), and the evidence carries a uniform sample of up to ``SAMPLE_EVENTS`` labelled events of the
since-previous window (serving builds its golden set from the samples of versions it promoted). An event
whose label is not final yet (a fake negative) is not sampled. Attached to a core that scores single
batches, it also measures each field's contribution to the ranking on a sample of the since-previous
window's events before the model learns them (``contribution.py``).

:meth:`attach` hooks it onto a trainer core's ``before_training`` (the field contribution), ``score_trained`` (the events trained and their batch) and
``update_metrics`` (their resolved labels and scores: in a fake-negative stream these arrive when each
impression's label is final), so every path that scores trained events feeds it. :meth:`take` returns the
snapshot's :class:`~streamrec.snapshot.Evidence` and starts the next since-previous window.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from streamrec.foundation import roc_auc
from streamrec.snapshot.evidence import Evidence, EventSample, Figures, input_health

from .contribution import ContributionMeter, final_labelled

if TYPE_CHECKING:
    from streamrec.foundation.model_config import ModelConfig

SEEN_BITS = 1 << 19  # bits per field in each of the two rotating id memories
ROTATE_FILL = 0.10  # the current memory is rotated when this share of its bits is set (false "seen" stays low)
_MIX = np.uint64(0x9E3779B97F4A7C15)
EPS = 1e-7
SAMPLE_EVENTS = 256  # labelled events of each since-previous window the evidence carries (serving's golden set)


def _figures(labels: np.ndarray, scores: np.ndarray) -> Figures:
    n = len(labels)
    if n == 0:
        return Figures()
    p = np.clip(scores.astype(np.float64), EPS, 1 - EPS)
    y = labels.astype(np.float64)
    losses = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    auc = roc_auc(y, p)
    return Figures(n, auc=None if auc != auc else float(auc), logloss=min(float(losses.mean()), 1e3),
                   label_rate=float(np.clip(y.mean(), 0, 1)), mean_prediction=float(p.mean()),
                   positives=int(np.count_nonzero(y > 0.5)), logloss_var=min(float(losses.var()), 1e6))


class _Sample:
    """A uniform sample of up to ``cap`` labelled events (bottom-k of a random key per event): each event
    becomes plain values only when its key is among the ``cap`` smallest so far."""

    def __init__(self, cap: int, fields, rng: np.random.Generator):
        self.cap, self.fields, self.rng = int(cap), list(fields), rng
        self.kept: list = []  # (key, label, dense row, {field: ids}), smallest key first after a trim

    def add(self, batch) -> None:
        labels, rows = final_labelled(batch)
        keys = self.rng.random(len(rows))
        if len(self.kept) >= self.cap:
            bar = self.kept[-1][0]
            rows, keys = rows[keys < bar], keys[keys < bar]
        for r, k in zip(rows.tolist(), keys.tolist()):
            ids = {f: tuple(int(i) for i in batch.sparse[f].values[batch.sparse[f].offsets[r]:
                                                                    batch.sparse[f].offsets[r + 1]])
                   if f in batch.sparse else () for f in self.fields}
            self.kept.append((k, int(labels[r] > 0.5), tuple(float(x) for x in batch.dense[r]), ids))
        if len(rows):
            self.kept.sort(key=lambda e: e[0])
            del self.kept[self.cap:]

    def take(self) -> EventSample | None:
        if not self.kept:
            return None
        kept, self.kept = self.kept, []
        return EventSample(tuple(e[1] for e in kept), tuple(e[2] for e in kept),
                           {f: tuple(e[3][f] for e in kept) for f in self.fields})


class _Scores:
    """Labels and scores of one task, in arrival order, optionally bounded to the newest ``cap`` events."""

    def __init__(self, cap: int | None = None):
        self.cap = cap
        self.parts: deque = deque()
        self.n = 0

    def add(self, labels: np.ndarray, scores: np.ndarray) -> None:
        if not len(labels):
            return
        self.parts.append((labels.copy(), scores.copy()))
        self.n += len(labels)
        while self.cap is not None and self.n - len(self.parts[0][0]) >= self.cap:
            self.n -= len(self.parts.popleft()[0])

    def figures(self) -> Figures:
        if not self.parts:
            return Figures()
        y = np.concatenate([p[0] for p in self.parts])
        s = np.concatenate([p[1] for p in self.parts])
        if self.cap is not None:
            y, s = y[-self.cap:], s[-self.cap:]
        return _figures(y, s)


class EvidenceCollector:
    """See the module docstring. Thread-safe: the trainer's loop feeds it, the snapshot path takes from it."""

    def __init__(self, task_names, fields, dense_dim: int, recent_events: int = 20_000,
                 sample_events: int = SAMPLE_EVENTS, seed: int = 0):
        self.task_names = list(task_names)
        self.fields = list(fields)
        self.dense_dim = int(dense_dim)
        self.recent_events = int(recent_events)
        self._lock = threading.Lock()
        self._recent = {t: _Scores(self.recent_events) for t in self.task_names}
        self._seen = {f: [np.zeros(SEEN_BITS, bool), np.zeros(SEEN_BITS, bool), 0] for f in self.fields}
        self._dead_at = None  # the dead-letter counter at the previous take
        self._sample = _Sample(sample_events, self.fields, np.random.default_rng(seed))
        self.seed = seed
        self._contribution: ContributionMeter | None = None  # set by ``attach`` to a core that can predict
        self._reset()

    def _reset(self) -> None:
        self._window = {t: _Scores() for t in self.task_names}
        self._records = 0
        self._dense_zero = 0
        self._col_zero = np.zeros(self.dense_dim, np.int64)
        self._empty = {f: 0 for f in self.fields}
        self._ids = {f: 0 for f in self.fields}
        self._novel = {f: 0 for f in self.fields}

    # -- feeding ---------------------------------------------------------------------------------
    def observe_inputs(self, batch, rows: np.ndarray | None = None) -> None:
        """The events ``rows`` of ``batch`` (all when None) reached training: count their input health."""
        if rows is not None and len(rows) != len(batch):
            batch = batch.take(np.asarray(rows))
        n = len(batch)
        if not n:
            return
        with self._lock:
            self._records += n
            if self._sample.cap:
                self._sample.add(batch)
            if self.dense_dim and batch.dense.size:
                zero = batch.dense == 0
                self._dense_zero += int(zero.all(axis=1).sum())
                self._col_zero += zero.sum(axis=0)
            for f in self.fields:
                j = batch.sparse.get(f)
                if j is None:
                    self._empty[f] += n
                    continue
                self._empty[f] += int((j.lengths == 0).sum())
                if len(j.values):
                    self._count_novel(f, np.asarray(j.values))

    def _count_novel(self, f: str, ids: np.ndarray) -> None:
        cur, prev, set_bits = self._seen[f]
        h = (ids.astype(np.uint64, copy=False) * _MIX) >> np.uint64(64 - 19)
        h = np.unique(h.astype(np.int64))  # distinct ids of the batch: a repeat within it is not new
        seen = cur[h] | prev[h]
        self._ids[f] += len(h)
        self._novel[f] += int((~seen).sum())
        fresh = h[~cur[h]]
        if len(fresh):
            cur[fresh] = True
            set_bits += len(fresh)
        if set_bits > ROTATE_FILL * SEEN_BITS:
            self._seen[f] = [np.zeros(SEEN_BITS, bool), cur, 0]
        else:
            self._seen[f][2] = set_bits

    # -- the id memory across restarts -----------------------------------------------------------
    def memory_state(self) -> dict[str, Any]:
        """The recent-id memory of every field (packed bits), for the checkpoint: a trainer restarted from it
        counts the ids it saw before the stop as seen, so its first snapshot's ``field_novel_share`` is the
        stream's, not that of an empty memory (which counts every id as new and makes serving's guard hold a
        good version as ``field_novel``)."""
        import torch

        with self._lock:
            return {"bits": SEEN_BITS, "fields": {
                f: {"cur": torch.from_numpy(np.packbits(cur)), "prev": torch.from_numpy(np.packbits(prev)),
                    "set": int(n)} for f, (cur, prev, n) in self._seen.items()}}

    def load_memory_state(self, st: Mapping[str, Any] | None) -> None:
        """Take back :meth:`memory_state`'s memory; a field it lacks (new in the schema), or a memory of another
        size, starts empty."""
        if not st or int(st.get("bits", 0)) != SEEN_BITS:
            return
        with self._lock:
            for f, m in (st.get("fields") or {}).items():
                if f in self._seen:
                    cur = np.unpackbits(np.asarray(m["cur"], np.uint8))[:SEEN_BITS].astype(bool)
                    prev = np.unpackbits(np.asarray(m["prev"], np.uint8))[:SEEN_BITS].astype(bool)
                    self._seen[f] = [cur, prev, int(m["set"])]

    def observe_scores(self, labels: np.ndarray, scores: np.ndarray) -> None:
        """Progressive labels and scores ``[n, T]`` (NaN label: that task's label is missing)."""
        if not len(labels):  # e.g. a batch of positives whose held fake-negative scores were resolved elsewhere
            return
        labels = np.asarray(labels, np.float32).reshape(len(labels), -1)
        scores = np.asarray(scores, np.float32).reshape(len(labels), -1)
        with self._lock:
            for t, name in enumerate(self.task_names):
                if t >= labels.shape[1]:
                    break
                has = ~np.isnan(labels[:, t]) & np.isfinite(scores[:, t])
                y, s = labels[has, t], scores[has, t]
                self._window[name].add(y, s)
                self._recent[name].add(y, s)

    def attach(self, core) -> "EvidenceCollector":
        """Feed this collector from ``core``'s scoring of trained events (see the module docstring)."""
        score_trained, update_metrics = core.score_trained, core.update_metrics

        def scored(batch, rows, labels, scores):
            self.observe_inputs(batch, rows)
            return score_trained(batch, rows, labels, scores)

        def updated(labels, scores):
            self.observe_scores(labels, scores)
            return update_metrics(labels, scores)

        core.score_trained = scored
        core.update_metrics = updated
        if getattr(core, "can_predict", False):  # a trainer group's rank scores inside its steps: not measured
            self._contribution = ContributionMeter(self.fields, core.predict, seed=self.seed)
            core.before_training = self._contribution.observe
        return self

    # -- taking ----------------------------------------------------------------------------------
    def _windows(self, scores: dict) -> Figures:
        per = {t: s.figures() for t, s in scores.items()}
        top = per[self.task_names[0]] if self.task_names else Figures()
        return dataclasses.replace(top, tasks=per) if len(per) > 1 else top

    def take(self, dead_letters_total: int = 0) -> Evidence:
        """The evidence block since the previous take (``dead_letters_total``: the consumer's counter now)."""
        with self._lock:
            dead = max(0, int(dead_letters_total) - (self._dead_at if self._dead_at is not None else
                                                       int(dead_letters_total)))
            self._dead_at = int(dead_letters_total)
            n = self._records
            ev = Evidence(self._windows(self._window), self._windows(self._recent), input_health(
                records=n, dead_letters=dead, dense_zero_share=self._dense_zero / n if n else 0.0,
                dense_column_zero_share=(self._col_zero / n).tolist() if n else [0.0] * self.dense_dim,
                field_empty_share={f: (self._empty[f] / n if n else 0.0) for f in self.fields},
                field_novel_share={f: (self._novel[f] / self._ids[f] if self._ids[f] else 0.0) for f in self.fields}),
                sample=self._sample.take(),
                field_contribution=self._contribution.take() if self._contribution is not None else {})
            self._reset()
        return ev


def collector_for(model: ModelConfig, recent_events: int, core) -> EvidenceCollector:
    """An :class:`EvidenceCollector` for ``model``, its longer window the newest ``recent_events`` events
    (``trainer.metrics_window``), attached to ``core``."""
    return EvidenceCollector(model.task_names, model.field_names, model.dense_dim, recent_events).attach(core)
