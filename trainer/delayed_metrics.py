"""Progressive validation of a fake-negative stream: each impression scored once, against its final label.

In a ``join.mode = fake_negative`` stream every impression arrives first as a ``fake_negative``
(label 0) and, if it converts, again as a ``positive`` of the same ``request_id``. Scoring both as
they come would count a converting impression twice (once with the wrong label). Instead:

* a ``fake_negative``'s progressive score (taken before it is trained on, as for every event) is
  HELD, keyed by its ``request_id``, for every task it carries a label for;
* a later ``positive`` of that ``request_id`` resolves each task it labels 1 as a positive with the
  HELD score; the positive itself is trained on, but never scored;
* when the event-time watermark (the largest ``ts`` of the events trained so far) passes the
  impression's ``ts + W + join.allowed_lateness_s`` (``W`` the longest task window: ``join.window_s`` or
  a task's ``@window_s`` in ``join.task_actions``; the joiner writes no positive
  after that), the tasks still unresolved are negatives with their held score.

The metrics therefore get one (label, score) per impression and task, when it is resolved. Events
without a feedback kind, and the ``negative`` / ``positive`` examples of window mode (final labels),
are scored as they come.

Events may be trained out of arrival order (FAE's hot and cold mini-batches), so a positive may be
trained before its fake negative: it then leaves a mark that resolves the fake negative the moment
it arrives. A positive whose fake negative never comes within the horizon is counted
(``unmatched_positives``) and not scored; one that arrives after its held score was released as a
negative (the joiner's actions topic lagging its impressions by more than the allowed lateness) is
counted too (it is among ``unmatched_positives``): its impression was already scored once.

Bound: the held scores live in this process's memory, one entry per impression inside the horizon
(rate x (window + lateness)), at most ``trainer.delayed_max_held``; past that the oldest are
released as negatives (``released_at_cap``). They are part of the trainer's counters
(:meth:`DelayedLabels.state`, inside ``TrainerCore.counters()``), so a checkpoint holds them beside
the metrics they feed and a restore continues with them.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

import numpy as np

from streamrec.foundation import FEEDBACK_CODES

FEEDBACK_FAKE_NEGATIVE, FEEDBACK_POSITIVE = FEEDBACK_CODES["fake_negative"], FEEDBACK_CODES["positive"]
_HELD, _EARLY = 0, 1  # an entry: a fake negative's held scores | positives trained before their fake negative


class DelayedLabels:
    """Held progressive scores of fake negatives (module doc). ``horizon_ms``: the longest task window
    plus ``join.allowed_lateness_s``, in ms; ``max_held``: the most entries kept."""

    def __init__(self, num_tasks: int, horizon_ms: int, max_held: int):
        self.num_tasks = int(num_tasks)
        self.horizon_ms = int(horizon_ms)
        self.max_held = max(1, int(max_held))
        # request_id -> [kind, deadline (ms), scores float32 [T], mask bool [T], seq]; kind _HELD: mask = the tasks
        # still waiting for a positive; kind _EARLY: mask = the tasks whose positive came first
        self.entries: dict[str, list] = {}
        self._due: list[tuple[int, int, str]] = []  # (deadline, seq, request_id); stale items are skipped
        self._seq = 0
        self.watermark: int | None = None
        self.resolved_positive = 0  # (impression, task) pairs scored as positives with their held score
        self.released_negative = 0  # ... scored as negatives when the watermark passed their horizon
        self.released_at_cap = 0  # ... of those, released early because max_held entries were held
        self.unmatched_positives = 0  # positives (per task) that found no held score to resolve
        self.duplicate_fake_negatives = 0  # a request_id's second fake negative while its first is held
        self.unkeyed = 0  # fake negatives or positives without a request_id: scored as they come

    def __len__(self) -> int:
        return len(self.entries)

    def resolve(self, labels: np.ndarray, scores: np.ndarray, ts: np.ndarray, feedback: np.ndarray,
                request_ids: Sequence[str | None] | None) -> tuple[np.ndarray, np.ndarray]:
        """Trained events (in training order: labels and scores ``[n, T]``, NaN label = missing) in; the
        (label, score) pairs due to the metrics out, ``[m, T]`` with NaN labels where a row has nothing for
        a task: the plain events as they are, the impressions resolved by these events and the watermark."""
        labels = np.asarray(labels, np.float32).reshape(-1, self.num_tasks)
        scores = np.asarray(scores, np.float32).reshape(-1, self.num_tasks)
        special = (feedback == FEEDBACK_FAKE_NEGATIVE) | (feedback == FEEDBACK_POSITIVE)
        if request_ids is None:
            keyed = np.zeros(len(labels), bool)
        else:
            keyed = np.fromiter((r is not None for r in request_ids), bool, count=len(labels))
        self.unkeyed += int((special & ~keyed).sum())
        special &= keyed
        out_y, out_p = [labels[~special]], [scores[~special]]
        ry: list[np.ndarray] = []
        rp: list[np.ndarray] = []
        for i in np.flatnonzero(special):
            rid = request_ids[i]
            lab = labels[i]
            if feedback[i] == FEEDBACK_FAKE_NEGATIVE:
                self._fake_negative(rid, int(ts[i]), lab, scores[i], ry, rp)
            else:
                self._positive(rid, int(ts[i]), lab, ry, rp)
        if len(ts):
            newest = int(np.max(ts))
            self.watermark = newest if self.watermark is None else max(self.watermark, newest)
        self._release(ry, rp)
        if ry:
            out_y.append(np.stack(ry))
            out_p.append(np.stack(rp))
        return np.concatenate(out_y), np.concatenate(out_p)

    # -- one event -------------------------------------------------------------------------------------
    def _fake_negative(self, rid: str, ts: int, lab: np.ndarray, score: np.ndarray, ry: list, rp: list) -> None:
        waiting = ~np.isnan(lab)
        e = self.entries.get(rid)
        if e is not None and e[0] == _HELD:
            self.duplicate_fake_negatives += 1
            return
        if e is not None:  # its positives were trained first: resolve them now, hold the rest
            early = e[3] & waiting
            if early.any():
                self._emit(np.where(early, 1.0, np.nan), score, ry, rp)
                self.resolved_positive += int(early.sum())
            waiting = waiting & ~early
            del self.entries[rid]
        if not waiting.any():
            return
        self._add(rid, [_HELD, ts + self.horizon_ms, np.array(score, np.float32), waiting, 0])

    def _positive(self, rid: str, ts: int, lab: np.ndarray, ry: list, rp: list) -> None:
        pos = lab == 1.0  # NaN compares False: the tasks this positive labels
        e = self.entries.get(rid)
        if e is None or e[0] == _EARLY:
            if self.watermark is not None and ts + self.horizon_ms < self.watermark:
                self.unmatched_positives += int(pos.sum())  # its fake negative was released already, or never came
                return
            if e is None:
                self._add(rid, [_EARLY, ts + self.horizon_ms, np.zeros(self.num_tasks, np.float32), pos.copy(), 0])
            else:
                e[3] |= pos
            return
        hit = pos & e[3]
        self.unmatched_positives += int((pos & ~e[3]).sum())  # a task resolved already (a repeated positive)
        if hit.any():
            self._emit(np.where(hit, 1.0, np.nan), e[2], ry, rp)
            self.resolved_positive += int(hit.sum())
            e[3] &= ~hit
        if not e[3].any():
            del self.entries[rid]

    # -- bound -----------------------------------------------------------------------------------------
    def _add(self, rid: str, entry: list) -> None:
        self._seq += 1
        entry[4] = self._seq
        self.entries[rid] = entry
        heapq.heappush(self._due, (entry[1], self._seq, rid))

    def _release(self, ry: list, rp: list) -> None:
        """Release the entries whose horizon the watermark passed, then the oldest beyond ``max_held``."""
        while self._due:
            deadline, seq, rid = self._due[0]
            e = self.entries.get(rid)
            if e is None or e[4] != seq:
                heapq.heappop(self._due)
                continue
            over = len(self.entries) > self.max_held
            if not over and (self.watermark is None or deadline >= self.watermark):
                break
            heapq.heappop(self._due)
            del self.entries[rid]
            if e[0] == _HELD:
                self._emit(np.where(e[3], 0.0, np.nan), e[2], ry, rp)
                self.released_negative += int(e[3].sum())
                if over:
                    self.released_at_cap += int(e[3].sum())
            else:
                self.unmatched_positives += int(e[3].sum())

    @staticmethod
    def _emit(label: np.ndarray, score: np.ndarray, ry: list, rp: list) -> None:
        ry.append(np.asarray(label, np.float32))
        rp.append(np.asarray(score, np.float32))

    # -- figures and checkpoint ------------------------------------------------------------------------
    def figures(self) -> dict[str, int]:
        return {"held": len(self.entries), "resolved_positive": self.resolved_positive,
                "released_negative": self.released_negative, "released_at_cap": self.released_at_cap,
                "unmatched_positives": self.unmatched_positives,
                "duplicate_fake_negatives": self.duplicate_fake_negatives, "unkeyed": self.unkeyed}

    def state(self) -> dict[str, Any]:
        """The held entries (oldest first) and the figures, JSON-able: a checkpoint's counters hold them."""
        order = sorted(self.entries.items(), key=lambda kv: kv[1][4])
        return {"watermark": self.watermark, **self.figures(),
                "entries": [[rid, e[0], e[1], [float(x) for x in e[2]], [bool(x) for x in e[3]]]
                            for rid, e in order]}

    def load_state(self, st: dict[str, Any] | None) -> None:
        self.entries, self._due, self._seq = {}, [], 0
        st = st or {}
        self.watermark = st.get("watermark")
        for k in ("resolved_positive", "released_negative", "released_at_cap", "unmatched_positives",
                  "duplicate_fake_negatives", "unkeyed"):
            setattr(self, k, int(st.get(k, 0)))
        for rid, kind, deadline, score, mask in st.get("entries", []):
            if len(score) != self.num_tasks:
                continue  # a checkpoint of a model with other tasks: those scores mean nothing here
            self._add(str(rid), [int(kind), int(deadline), np.asarray(score, np.float32), np.asarray(mask, bool), 0])
