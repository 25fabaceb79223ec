"""Serving's golden set: labelled events of windows whose versions users were given, to judge a candidate on
evidence that does not come from the stream it was trained on.

A window's evidence is measured on the stream the model trains on: once a model has fitted a broken stream
(a misaligned join, flipped labels), its own window passes. The golden set holds the evidence samples
(``manifest.evidence.sample``) of promoted versions only, never of a held stretch, at most ``max_events``
events, the oldest out first. A promoted version's sample joins the set when the next version is promoted:
a version has just trained on its own window's events and scores them better than any later model would,
so its own sample would make every candidate look worse. At each promotion the promoted version scores the whole set and those scores
are kept; a candidate scores the same events and :meth:`GoldenSet.compare` gives the paired difference (AUC
with DeLong's standard error, logloss with the standard error of the per-event differences). The guard
decides on it (reason ``golden``); the caller, which has the models, computes it.

The set scores through a ``predict(EventBatch) -> [events, tasks]`` function and judges the first task.
Events whose dense width or fields differ from the promoted version's (the model's schema changed) start
the set anew.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from streamrec.foundation import EventBatch, JaggedIds
from streamrec.snapshot.evidence import EventSample

from streamrec.foundation.noise import mean_se, paired_auc

log = logging.getLogger("streamrec.serving")

MIN_EVENTS = 1000  # a golden set smaller than this is not compared (its figures would be mostly noise)
EPS = 1e-7

Predict = Callable[[EventBatch], np.ndarray]


@dataclass(frozen=True)
class GoldenComparison:
    """A candidate against the promoted version on the same golden events (first task)."""

    events: int
    auc: float  # the candidate's AUC
    auc_promoted: float
    auc_se: float  # the standard error of auc - auc_promoted (paired)
    logloss: float
    logloss_promoted: float
    logloss_se: float  # the standard error of logloss - logloss_promoted (paired, per event)

    @property
    def auc_delta(self) -> float:
        return self.auc - self.auc_promoted

    @property
    def logloss_delta(self) -> float:
        return self.logloss - self.logloss_promoted


def sample_batch(sample: EventSample, fields: Sequence[str], dense_dim: int) -> EventBatch | None:
    """The events of ``sample`` as a batch for a model of ``fields`` and ``dense_dim`` (a field the sample
    lacks has no ids); None when the dense width differs or the sample is empty."""
    n = len(sample)
    if not n or any(len(row) != dense_dim for row in sample.dense):
        return None
    sparse = {}
    for f in fields:
        lists = sample.ids.get(f) or ((),) * n
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum([len(one) for one in lists], out=offsets[1:])
        sparse[f] = JaggedIds(np.array([i for one in lists for i in one], np.int64), offsets)
    dense = np.array(sample.dense, np.float32).reshape(n, dense_dim)
    return EventBatch(ts=np.zeros(n, np.int64), labels=np.array(sample.labels, np.float32), dense=dense, sparse=sparse)


def _losses(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    p = np.clip(scores.astype(np.float64), EPS, 1 - EPS)
    return -(labels * np.log(p) + (1 - labels) * np.log(1 - p))


def _first_task(scores) -> np.ndarray:
    s = np.asarray(scores)
    return s.reshape(len(s), -1)[:, 0]


class GoldenSet:
    """See the module docstring."""

    def __init__(self, max_events: int):
        self.max_events = int(max_events)
        self.parts: deque[EventBatch] = deque()  # promoted versions' samples, oldest first
        self.schema: tuple | None = None  # (fields, dense_dim) of the events held
        self.batch: EventBatch | None = None  # every part in one batch
        self.reference: np.ndarray | None = None  # the promoted version's scores on ``batch``
        self.pending: EventBatch | None = None  # the newest promoted version's sample: it joins at the next

    def __len__(self) -> int:
        return len(self.batch) if self.batch is not None else 0

    def clear(self) -> None:
        self.parts.clear()
        self.schema, self.batch, self.reference, self.pending = None, None, None, None

    def promoted(self, sample: EventSample | None, predict: Predict, fields: Sequence[str], dense_dim: int) -> None:
        """A version was promoted: add its evidence sample (None: nothing to add) and keep its scores on the
        whole set."""
        if not self.max_events:
            return
        schema = (tuple(fields), int(dense_dim))
        if schema != self.schema:
            self.clear()
            self.schema = schema
        part, self.pending = self.pending, sample_batch(sample, fields, dense_dim) if sample is not None else None
        if part is not None:
            self.parts.append(part.take(np.arange(min(len(part), self.max_events))))
            while sum(len(p) for p in self.parts) > self.max_events:
                self.parts.popleft()
        self.batch = EventBatch.concat(list(self.parts), dense_dim, fields) if self.parts else None
        self.reference = None
        if self.batch is not None and len(self.batch) >= MIN_EVENTS:
            try:
                self.reference = _first_task(predict(self.batch))
            except Exception as e:  # a version that cannot score the set: no golden comparison until the next
                log.warning("golden set not scored by the promoted version: %s: %s", type(e).__name__, e)

    def compare(self, predict: Predict) -> GoldenComparison | None:
        """The candidate scoring through ``predict`` against the promoted version on the golden set; None while
        the set is too small, one-class, or the candidate cannot score it."""
        if self.batch is None or self.reference is None:
            return None
        try:
            cand = _first_task(predict(self.batch))
        except Exception as e:
            log.warning("golden set not scored by the candidate: %s: %s", type(e).__name__, e)
            return None
        y = self.batch.labels.astype(np.float64)
        aucs = paired_auc(y, cand, self.reference)
        if aucs is None or len(cand) != len(y):
            return None
        lc, lr = _losses(y, cand), _losses(y, self.reference)
        se = mean_se(float(np.var(lc - lr, ddof=1)), len(y))
        return GoldenComparison(len(y), aucs[0], aucs[1], aucs[2], float(lc.mean()), float(lr.mean()),
                                se if math.isfinite(se) else 0.0)
