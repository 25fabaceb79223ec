"""Request merging: Predict requests that arrive while another is being scored are
scored together, in one pooling + forward pass (dynamic batching without a timer).

Why: in the running server most of a request's CPU is fixed cost (dozens of small
numpy and torch calls on caches that gRPC and the other threads keep cold), not the
arithmetic, which grows with the batch. Merging the requests that queue up under
concurrency pays that cost once per merged batch. A lone request never waits: it
is scored at once by its own thread.

Leader/follower, no extra thread: the handler that finds nobody scoring becomes the
leader and scores a round (queued requests of the same served version, up to
``max_events``); then it hands the lead to the oldest request still queued and
returns its own result. Each request keeps the version it acquired when it arrived,
so a request still finishes on the version it started on across a swap.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from streamrec.foundation import EventBatch

Score = Callable[[Any, EventBatch], np.ndarray]  # (served version, batch) -> one score per event


class _Request:
    __slots__ = ("version", "batch", "ready", "lead", "scores", "error")

    def __init__(self, version, batch: EventBatch):
        self.version = version
        self.batch = batch
        self.ready = threading.Event()  # set when scored, or when handed the lead
        self.lead = False
        self.scores: np.ndarray | None = None
        self.error: BaseException | None = None


class RequestMerger:
    def __init__(self, score: Score, fields: Callable[[Any], Sequence[str]], dense_dim: Callable[[Any], int],
                 max_events: int):
        self._score = score
        self._fields = fields
        self._dense_dim = dense_dim
        self.max_events = int(max_events)
        self._lock = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._busy = False
        self.rounds = 0  # scoring passes run
        self.merged = 0  # requests scored in a pass with others

    def score(self, version, batch: EventBatch) -> np.ndarray:
        """Scores of ``batch`` under ``version`` (which the caller holds until this returns)."""
        if self.max_events <= 0:
            return self._score(version, batch)
        with self._lock:
            alone = not self._busy  # nobody scoring: the queue is empty (requests queue only behind a round)
            self._busy = True
        if alone:  # the common case at low load: scored at once, no queue entry, no event to wait on
            try:
                return self._score(version, batch)
            finally:
                self._pass_lead(merged=0)
        req = _Request(version, batch)
        with self._lock:
            self._queue.append(req)
            lead = not self._busy  # the round in progress ended meanwhile, leaving nobody queued
            self._busy = True
        if not lead:
            req.ready.wait()
        if req.scores is None and req.error is None:  # leader, or handed the lead: req heads the queue
            self._round()
        if req.error is not None:
            raise req.error
        return req.scores

    def _round(self) -> None:
        with self._lock:
            first = self._queue.popleft()
            take, n = [first], len(first.batch)
            keep: deque[_Request] = deque()
            while self._queue:  # same version only, up to max_events; others keep their place
                r = self._queue.popleft()
                if r.version is first.version and n + len(r.batch) <= self.max_events:
                    take.append(r)
                    n += len(r.batch)
                else:
                    keep.append(r)
            self._queue = keep
        try:
            if len(take) == 1:
                first.scores = self._score(first.version, first.batch)
            else:
                v = first.version
                merged = EventBatch.concat([r.batch for r in take], self._dense_dim(v), self._fields(v))
                scores = self._score(v, merged)
                for r, s in zip(take, np.split(scores, np.cumsum([len(r.batch) for r in take])[:-1])):
                    r.scores = s
        except BaseException as e:  # every request of the round gets the error, none hangs
            for r in take:
                r.error = e
        for r in take[1:]:
            r.ready.set()
        self._pass_lead(merged=len(take) if len(take) > 1 else 0)

    def _pass_lead(self, merged: int) -> None:
        """A round ended: the oldest request queued meanwhile leads the next one, or nobody is scoring."""
        with self._lock:
            self.rounds += 1
            self.merged += merged
            nxt = self._queue[0] if self._queue else None
            if nxt is None:
                self._busy = False
            else:
                nxt.lead = True
        if nxt is not None:
            nxt.ready.set()


def score_queued(v, items: Sequence[tuple], limits) -> tuple[list[int], np.ndarray, int]:
    """Score queued answered requests with another version ``v`` (a shadow line's, a candidate's) in one
    pass. ``items``: ``(request, batch, fields)`` per request, ``batch`` the request as decoded for the
    answer (reused when ``v`` reads the same fields and dense width, else the request is decoded for ``v``).
    Returns the indices of the items scored, their first-task scores concatenated in that order, and how
    many ``v`` refused to decode."""
    from .convert import RequestError, request_to_batch_ids

    batches, kept, refused = [], [], 0
    for i, (request, batch, fields) in enumerate(items):
        if batch is None or list(v.fields) != list(fields) or batch.dense.shape[1] != v.dense_dim:
            try:
                batch, _ = request_to_batch_ids(request, v.fields, v.dense_dim, limits)
            except RequestError:
                refused += 1
                continue
        batches.append(batch)
        kept.append(i)
    if not batches:
        return [], np.zeros(0), refused
    merged = batches[0] if len(batches) == 1 else EventBatch.concat(batches, v.dense_dim, v.fields)
    return kept, v.predict(merged)[:, 0].astype(np.float64), refused
