"""Each field's contribution to the model's ranking, measured on the events the trainer is about to learn from
(``manifest.evidence.field_contribution``).

A field's contribution is the model's AUC on a set of labelled events minus its AUC on the same events with
that field's ids removed (an empty bag: the field adds nothing to the pooled input), with DeLong's standard
error of that paired difference (``streamrec.foundation.noise.paired_auc``). The events are scored before
the step that trains on them, as progressive validation scores them: a field whose ids stop belonging to
their events (a misaligned upstream join) stops helping the model rank at once, while the window's AUC and
the golden set move by less than their noise; a paired difference on the same events cancels most of that
noise.

The events are a uniform sample of each since-previous window's labelled events, at most ``cap``
(``CONTRIBUTION_EVENTS``): every event draws a random key, and only an event whose key is among the ``cap``
smallest of the window so far is scored (bottom-k). A window of ``n`` events therefore scores all of them
when ``n <= cap`` and about ``cap * (1 + ln(n / cap))`` otherwise, each as ``1 + fields`` rows of one
forward pass without gradients, and memory stays at ``cap`` events. An event whose label is not final yet
(a fake negative) is not sampled; the first task's label is the one judged.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

import numpy as np

from streamrec.foundation import FEEDBACK_CODES, EventBatch, JaggedIds
from streamrec.foundation.noise import paired_auc
from streamrec.snapshot.evidence import Contribution

CONTRIBUTION_EVENTS = 1024  # labelled events of each since-previous window scored with and without each field

Predict = Callable[[EventBatch], np.ndarray]


def final_labelled(batch: EventBatch) -> tuple[np.ndarray, np.ndarray]:
    """The first task's label of every event of ``batch``, and the events whose label is there and final (not
    a fake negative, whose label may still turn positive)."""
    y = batch.task_labels[:, 0] if batch.task_labels is not None else batch.labels
    ok = ~np.isnan(y)
    if batch.feedback is not None:
        ok &= batch.feedback != FEEDBACK_CODES["fake_negative"]
    return y, np.flatnonzero(ok)


def without_each_field(batch: EventBatch, fields: Sequence[str]) -> EventBatch:
    """``batch`` followed by one copy of it per field of ``fields`` with that field's ids removed."""
    n = len(batch)
    empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
    names = list(dict.fromkeys([*batch.sparse, *fields]))
    copies = [None, *fields]  # None: the batch as it is
    return EventBatch(ts=np.tile(batch.ts, len(copies)), labels=np.tile(batch.labels, len(copies)),
                      dense=np.tile(batch.dense, (len(copies), 1)),
                      sparse={f: JaggedIds.concat([empty if f == c else batch.sparse.get(f, empty) for c in copies])
                              for f in names})


class ContributionMeter:
    """See the module docstring. ``observe`` runs on the trainer's loop before a step trains the events it
    is given; ``take`` (the snapshot path) returns the window's contributions and starts the next window."""

    def __init__(self, fields: Sequence[str], predict: Predict, cap: int = CONTRIBUTION_EVENTS, seed: int = 0):
        self.fields = list(fields)
        self.predict = predict
        self.cap = int(cap)
        self.rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._keys = np.zeros(0)  # sorted: the kept events' keys, smallest first
        self._labels = np.zeros(0)
        self._scores = np.zeros((0, 1 + len(self.fields)))  # per event: as is, then each field removed

    def observe(self, batches: Sequence[EventBatch]) -> None:
        """Score the events of ``batches`` the sample takes (the model has not trained on them yet), in one
        forward pass."""
        if not self.cap or not self.fields:
            return
        picked, keys, labels = [], [], []
        with self._lock:
            bar = self._keys[-1] if len(self._keys) >= self.cap else np.inf
        for batch in batches:
            y, rows = final_labelled(batch)
            k = self.rng.random(len(rows))
            rows, k = rows[k < bar], k[k < bar]
            if len(rows) > self.cap:  # the batch's own smallest keys: the rest cannot stay
                first = np.argsort(k, kind="stable")[:self.cap]
                rows, k = rows[first], k[first]
            if len(rows):
                picked.append(batch.take(rows))
                keys.append(k)
                labels.append((y[rows] > 0.5).astype(np.float64))
        if not picked:
            return
        keys_all = np.concatenate(keys)
        first = np.argsort(keys_all, kind="stable")[:self.cap]  # no more than the sample can keep
        sub = EventBatch.concat(picked, picked[0].dense.shape[1], list(picked[0].sparse)).take(first)
        scored = np.asarray(self.predict(without_each_field(sub, self.fields)), np.float64)
        scored = scored[:, 0].reshape(1 + len(self.fields), len(first)).T
        with self._lock:
            k = np.concatenate([self._keys, keys_all[first]])
            order = np.argsort(k, kind="stable")[:self.cap]
            self._keys = k[order]
            self._labels = np.concatenate([self._labels, np.concatenate(labels)[first]])[order]
            self._scores = np.concatenate([self._scores, scored])[order]

    def take(self) -> dict[str, Contribution]:
        """Per field, its contribution on the window's sample (a field is left out when the sample has fewer
        than two events of either class); starts the next window."""
        with self._lock:
            labels, scores = self._labels, self._scores
            self._reset()
        out: dict[str, Contribution] = {}
        for i, f in enumerate(self.fields):
            paired = paired_auc(labels, scores[:, 0], scores[:, 1 + i])
            if paired is not None:
                full, removed, se = paired
                out[f] = Contribution(float(np.clip(full - removed, -1, 1)), float(min(se, 1.0)), len(labels))
        return out
