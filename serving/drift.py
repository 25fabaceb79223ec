"""The live drift watch: a model line's candidate scores live Predict requests beside the promoted version.

While a line's newest installed version (its head) is not the promoted version users get (held, recovering,
or waiting for ``serving.guard.settle_s``), each answered Predict request of that line is also scored by the
head, off the answer path, and the two first-task scores of every event are paired (:class:`DriftFigures`).
The guard judges the figures (``Guard.judge_drift``, reason ``drift``); the book (``history.py``) acts on the
verdict for a head that waits only for the recovery count or the settle rule.

Why live requests: every other piece of evidence is measured on the trainer's stream or on the golden set of
that stream's past; live requests are what users send now. A candidate that learnt something gross (flipped
labels, a broken output bias, a dense feature on another scale) scores them far from the promoted version.

**The figure** is the mean over paired events of ``|logit(candidate) - logit(promoted)|`` (scores clipped to
``[1e-7, 1 - 1e-7]``), with its standard error over events. Log-odds, because a model's output is additive
there: a shifted output bias is the same difference at every score, and a rare event's 0.01 against 0.03
counts as much as a common one's 0.25 against 0.5; the absolute value, because a candidate that reorders
events keeps its mean score while its events move. The mean score ratio (candidate / promoted) is kept beside
it for the reader: it shows a calibration shift's direction, and misses reordering, so it is not judged.

**Bounds**: the answer never waits for the watch. At most ``serving.shadow_max_pending`` requests wait for
it (more are not paired: ``skipped``); one worker thread scores the queued requests of one candidate together
(up to ``serving.merge_max_events`` events, as the merger does), and a candidate is paired on at most
``MAX_EVENTS`` events (its figure is then precise far beyond the bound it is judged against). Answers of a
version that is not the line's newest promoted one (a rollback pin) are not paired. The figures belong to one
(candidate, promoted) pair: a new head or a new promotion starts them anew; a restart empties them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from .merge import score_queued
from .offpath import OffPathWorker

log = logging.getLogger("streamrec.serving")

MAX_EVENTS = 50_000  # paired events after which a candidate is no longer scored on live requests
EPS = 1e-7


def log_odds(p: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    return np.log(q / (1 - q))


@dataclass
class DriftFigures:
    """A candidate's first-task scores paired with the promoted version's on the same live events."""

    candidate: int  # the candidate's version
    promoted: int  # the promoted version whose answers it is paired with
    requests: int = 0
    events: int = 0
    candidate_sum: float = 0.0
    promoted_sum: float = 0.0
    abs_logit_sum: float = 0.0  # sum over events of |logit(candidate) - logit(promoted)|
    abs_logit_sq: float = 0.0  # ... of its square (for the standard error)

    def add(self, candidate: np.ndarray, promoted: np.ndarray) -> None:
        """Pair one request's scores (one per event, same order)."""
        d = np.abs(log_odds(candidate) - log_odds(promoted))
        self.requests += 1
        self.events += len(d)
        self.candidate_sum += float(np.sum(candidate, dtype=np.float64))
        self.promoted_sum += float(np.sum(promoted, dtype=np.float64))
        self.abs_logit_sum += float(d.sum())
        self.abs_logit_sq += float((d * d).sum())

    @property
    def mean_abs_logit(self) -> float:
        return self.abs_logit_sum / self.events if self.events else 0.0

    @property
    def mean_abs_logit_se(self) -> float:
        """The standard error of ``mean_abs_logit`` over events (inf below two events)."""
        n = self.events
        if n < 2:
            return math.inf
        var = max(0.0, (self.abs_logit_sq - n * self.mean_abs_logit ** 2) / (n - 1))
        return math.sqrt(var / n)

    @property
    def score_ratio(self) -> float:
        """Mean candidate score / mean promoted score (0 before any event)."""
        return self.candidate_sum / self.promoted_sum if self.promoted_sum else 0.0

    def figures(self) -> dict:
        return {"candidate_version": self.candidate, "promoted_version": self.promoted, "requests": self.requests,
                "events": self.events, "mean_abs_logit_diff": self.mean_abs_logit,
                "mean_abs_logit_diff_se": self.mean_abs_logit_se if self.events > 1 else 0.0,
                "score_ratio": self.score_ratio}


class DriftWatch:
    """The watch of every line of one server (see the module docstring). ``service(line)``: the line's
    service (its ``book`` and ``current``), or None."""

    def __init__(self, service, limits, max_pending: int, merge_events: int):
        self.service = service
        self.limits = limits
        self.merge_events = max(1, int(merge_events))
        self.errors = 0  # requests the candidate could not score
        # queued: (line, candidate, promoted, request, scores, batch, fields)
        self._worker = OffPathWorker("drift", self._take, self._round, self._failed, max_pending)

    def offer(self, line: str, version: int, request, scores: np.ndarray, batch=None, fields=()) -> None:
        """``line`` answered ``request`` with ``version`` (first-task ``scores``): queue it for the line's
        candidate, when it has one (cheap, on the answer path: no scoring here)."""
        svc = self.service(line)
        candidate = svc.book.drift_candidate(version) if svc is not None else 0
        if candidate:
            self._worker.put((line, candidate, version, request, scores, batch, list(fields)))

    @property
    def skipped(self) -> int:
        """Requests not paired: ``max_pending`` were waiting."""
        return self._worker.refused

    def _take(self, queue) -> list:
        """One candidate's queued requests (those of the oldest), up to ``merge_events`` events; the others
        keep their place."""
        first, take, n, rest = queue[0], [], 0, []
        while queue:
            item = queue.popleft()
            if item[:3] == first[:3] and (not take or n + len(item[4]) <= self.merge_events):
                take.append(item)
                n += len(item[4])
            else:
                rest.append(item)
        queue.extend(rest)
        return take

    def _failed(self, take: list, e: Exception) -> None:
        self.errors += len(take)
        log.debug("drift watch could not score %d requests: %s", len(take), e)

    def _round(self, take: list) -> None:
        line, candidate, promoted = take[0][:3]
        svc = self.service(line)
        head = svc.book.head if svc is not None else None
        if head is None or head.version != candidate or not head.acquire():
            return  # a newer head or a promotion since: these answers pair with nothing judged now
        try:
            kept, scores, refused = score_queued(head, [(it[3], it[5], it[6]) for it in take], self.limits)
        finally:
            head.release()
        self.errors += refused
        at, pairs = 0, []
        for i in kept:
            primary = take[i][4]
            pairs.append((scores[at:at + len(primary)], primary))
            at += len(primary)
        svc.book.drift_seen(head, promoted, pairs, svc.current)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until no request waits for the watch (tests); False on timeout."""
        return self._worker.drain(timeout)

    def close(self) -> None:
        self._worker.close()
