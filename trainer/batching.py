"""Event-driven mini-batches: where a mini-batch starts and ends depends only on the
sequence of events, never on how Kafka happened to deliver them (poll sizes, fetch
sizes, message sizes), so the same stream and seed give the same model.

Events join one of two queues as they arrive: *hot* (every id is in the device's hot
set) and *cold* (FAE, Adnan et al. VLDB'22), or a single *mixed* queue when there is
no hot set. A queue becomes a training step when it holds ``batch_size`` events, so
hot steps are full-size rather than fragments of a window; an event never waits more
than ``max_wait`` arrivals (its queue is then trained as it is).

A hot event waits at most ``hot_wait`` arrivals for a *full* hot batch. It joins the
hot queue only while at least ``batch_size`` of the last ``hot_wait`` arrivals were hot
(at that rate its batch fills in time); otherwise, or when its batch has not filled
after ``hot_wait`` arrivals, it trains with the cold events in arrival order. Why:
holding hot events back costs AUC on a stream whose hot share is small (MovieLens-100k
with 500 hot rows: partial hot batches after ``max_wait`` lose AUC against arrival order;
held hot events are scored by a model that has not learnt from the user's previous
events, and one-sided hot-only steps shift the cold events' scores; BENCHMARKS.md,
quality). So on such a stream FAE falls back towards arrival order, keeping store-free
hot steps for the bursts where they fill, and on a stream whose hot share is large (the
synthetic one) nothing changes. With ``hot_wait >= max_wait`` every hot event joins the
hot queue and waits up to ``max_wait`` arrivals, so hot batches may train partial.

Progressive validation must not peek: an event is scored by a model trained only on
events that arrived before it. A step trains events that may have arrived after some
events still waiting in the other queue; those waiting events are scored right before
that step (``Step.prescore``). With one queue (arrival order) nothing is ever scored
early: every event is scored in its own step's forward pass, as plain DLRM does.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from streamrec.foundation import EventBatch, JaggedIds


@dataclass
class Step:
    kind: str  # "hot" | "cold" | "mixed"
    rows: np.ndarray  # positions in the batcher's buffer, arrival order
    prescore: np.ndarray  # waiting events (buffer positions) to score before this step trains


class EventBatcher:
    """Queues of waiting events and the steps they form (no model here: the trainer runs the steps)."""

    def __init__(self, batch_size: int, max_wait: int, dense_dim: int, fields: Sequence[str],
                 hot_wait: int | None = None, num_tasks: int = 1):
        self.batch_size = max(1, int(batch_size))
        self.max_wait = max(self.batch_size, int(max_wait))
        # a hot event waits at most this many arrivals for a full hot batch, then joins the cold queue;
        # >= max_wait: never (the hot queue then trains as it is after max_wait, a partial hot batch)
        self.hot_wait = self.max_wait if hot_wait is None else max(1, int(hot_wait))
        self.dense_dim, self.fields = int(dense_dim), list(fields)
        self.num_tasks = max(1, int(num_tasks))  # the width of ``scores``: one progressive score per task
        # False only to measure what progressive validation's early scores cost (``bench train
        # --without-early-scores``): waiting events are then scored in their own later step, so the
        # progressive metrics peek at later events
        self.early_scores = True
        self._reset()

    def _reset(self) -> None:
        self.buffer = EventBatch.empty(self.dense_dim, self.fields)
        self.seq = np.zeros(0, np.int64)  # arrival number of each buffered event (for max_wait)
        # each buffered event's Kafka partition and record offset (-1: unknown): a step's records, by position
        self.part = np.zeros(0, np.int32)
        self.off = np.zeros(0, np.int64)
        self.hot = np.zeros(0, bool)
        self.scores = np.zeros((0, self.num_tasks), np.float32)
        self.scored = np.zeros(0, bool)
        self.queues: dict[str, list[int]] = {"hot": [], "cold": []}  # "cold" is the mixed queue without a hot set
        self.next_seq = 0
        self.any_hot = False  # a hot event has arrived (else the one queue is "mixed": arrival order)
        self.recent = np.zeros(0, bool)  # the last hot_wait arrivals' hot flags (the gate of ``_gate``)

    def __len__(self) -> int:
        """Events waiting (received, not yet trained)."""
        return len(self.buffer)

    # -- planning ------------------------------------------------------------------
    def add(self, batch: EventBatch, hot: np.ndarray | None) -> list[Step]:
        """Queue ``batch`` (``hot``: per event, or None for no hot set) and return the steps it completes."""
        n_old, n = len(self.buffer), len(batch)
        if n == 0:
            return []
        hot = np.zeros(n, bool) if hot is None else np.asarray(hot, bool)
        self.any_hot = self.any_hot or bool(hot.any())
        hot = self._gate(hot)
        self.buffer = EventBatch.concat([self.buffer, batch], self.dense_dim, self.fields) if n_old else \
            EventBatch(batch.ts, batch.labels, batch.dense, batch.sparse, batch.request_ids,
                       task_labels=batch.task_labels, task_names=batch.task_names, feedback=batch.feedback)
        self.seq = np.concatenate([self.seq, self.next_seq + np.arange(n, dtype=np.int64)])
        self.next_seq += n
        part, off = batch.source_partitions, batch.source_records
        self.part = np.concatenate([self.part, np.full(n, -1, np.int32) if part is None else np.asarray(part, np.int32)])
        self.off = np.concatenate([self.off, np.full(n, -1, np.int64) if off is None else np.asarray(off, np.int64)])
        self.hot = np.concatenate([self.hot, hot])
        self.scores = np.concatenate([self.scores, np.full((n, self.num_tasks), np.nan, np.float32)])
        self.scored = np.concatenate([self.scored, np.zeros(n, bool)])
        steps: list[Step] = []
        pos, end, bs = n_old, n_old + n, self.batch_size
        hq, cq = self.queues["hot"], self.queues["cold"]
        while pos < end:
            h, left, s0 = self.hot[pos:end], end - pos, int(self.seq[pos])
            # arrivals from ``pos`` until: the event that fills a queue (it is queued first) ...
            fill_h = _first_reaching(np.cumsum(h), bs - len(hq))
            fill_c = _first_reaching(np.cumsum(~h), bs - len(cq))
            # ... or the arrival at which the oldest waiting event has waited its limit (before it is queued)
            spill = _INF
            if hq and self.hot_wait < self.max_wait:
                spill = _within(int(self.seq[hq[0]]) + self.hot_wait - s0, left)
            age = _INF
            waiting = [q[0] for q in (hq, cq) if q]
            if waiting:
                age = _within(int(self.seq[min(waiting)]) + self.max_wait - s0, left)
            fill = min(fill_h, fill_c)
            if spill <= age and spill <= fill and spill < _INF:
                # the oldest hot event cannot wait longer for a full hot batch: it trains with the cold ones
                self._enqueue(pos, pos + spill)
                pos += spill
                p = hq.pop(0)
                bisect.insort(cq, p)  # cq stays in arrival order (no array copy of the queue per spilled event)
                if len(cq) >= bs:
                    steps.append(self._emit("cold"))
            elif age <= fill and age < _INF:  # the oldest waiting event has waited long enough: train its queue
                self._enqueue(pos, pos + age)
                pos += age
                kind = "hot" if hq and hq[0] == min(waiting) else "cold"
                steps.append(self._emit(kind))
            elif fill < _INF:
                self._enqueue(pos, pos + fill + 1)
                pos += fill + 1
                steps.append(self._emit("hot" if fill_h <= fill_c else "cold"))
            else:
                self._enqueue(pos, end)
                pos = end
        return steps

    def _gate(self, hot: np.ndarray) -> np.ndarray:
        """Which hot events join the hot queue: those that arrive while at least ``batch_size`` of the last
        ``hot_wait`` arrivals were hot (at that rate a full hot batch fills in time; at the start of a stream
        the same rate over the arrivals so far, so an all-hot stream is all-hot from its first event). The
        others train in arrival order with the cold events, without waiting: on a stream whose hot events
        are sparse FAE falls back to arrival order instead of delaying them (BENCHMARKS.md, quality)."""
        if self.hot_wait >= self.max_wait:  # no gate: every hot event queues, hot batches may be partial
            return hot
        hist = np.concatenate([self.recent, hot])
        self.recent = hist[-self.hot_wait:]
        if not hot.any():
            return hot
        count = np.concatenate([[0], np.cumsum(hist, dtype=np.int64)])
        at = len(hist) - len(hot) + np.arange(len(hot))
        seen = np.minimum(at, self.hot_wait)  # fewer than hot_wait arrivals so far: their rate, scaled up
        return hot & ((count[at] - count[at - seen]) * self.hot_wait >= self.batch_size * seen)

    def drain(self) -> list[Step]:
        """Steps for everything still waiting (partial batches), the queue with the oldest event first."""
        steps = []
        while any(self.queues.values()):
            kind = min((q[0], k) for k, q in self.queues.items() if q)[1]
            steps.append(self._emit(kind))
        return steps

    def _enqueue(self, lo: int, hi: int) -> None:
        h = self.hot[lo:hi]  # each queue gets its positions in arrival order (vectorised: no Python per event)
        self.queues["hot"].extend((np.flatnonzero(h) + lo).tolist())
        self.queues["cold"].extend((np.flatnonzero(~h) + lo).tolist())

    def _emit(self, kind: str) -> Step:
        rows = np.asarray(self.queues[kind], np.int64)
        self.queues[kind].clear()  # in place: ``add`` holds the queue lists
        other = np.asarray(self.queues["cold" if kind == "hot" else "hot"], np.int64)
        early = other[(other < rows[-1]) & ~self.scored[other]]  # arrived before this step's newest event
        if not self.early_scores:
            early = early[:0]
        self.scored[early] = True
        self.scored[rows] = True
        label = "mixed" if not self.any_hot and kind == "cold" else kind
        return Step(label, rows, early)

    def retire(self) -> None:
        """Forget the trained events (every position not in a queue); call after running the steps."""
        keep = np.asarray(sorted(self.queues["hot"] + self.queues["cold"]), np.int64)
        self._keep(keep)

    def _keep(self, keep: np.ndarray) -> None:
        if len(keep) == len(self.buffer):
            return
        remap = {int(p): i for i, p in enumerate(keep)}
        self.buffer = self.buffer.take(keep)
        self.seq, self.hot, self.scores, self.scored, self.part, self.off = (
            a[keep] for a in (self.seq, self.hot, self.scores, self.scored, self.part, self.off))
        self.queues = {k: [remap[p] for p in q if p in remap] for k, q in self.queues.items()}

    def remove(self, rows: np.ndarray) -> EventBatch:
        """Take these waiting events (buffer positions) out of their queues, never to be trained (restored
        events whose records crashed a training step); returns them, with their sources."""
        rows = np.asarray(rows, np.int64)
        out = self.buffer.take(rows)
        out.source_partitions, out.source_records = self.part[rows], self.off[rows]
        mask = np.ones(len(self.buffer), bool)
        mask[rows] = False
        self._keep(np.flatnonzero(mask))
        return out

    # -- checkpoint ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The waiting events, their early scores and queues: a checkpoint holds them, so the offsets it
        commits may cover events not trained yet and a resumed trainer forms the same batches."""
        b = self.buffer
        return {"ts": b.ts, "labels": b.labels, "dense": b.dense, "task_labels": b.task_labels,
                "feedback": b.feedback, "request_ids": b.request_ids,
                "sparse": {f: (b.sparse[f].values, b.sparse[f].offsets) for f in self.fields},
                "seq": self.seq, "part": self.part, "off": self.off, "hot": self.hot, "scores": self.scores, "scored": self.scored,
                "queues": {k: list(q) for k, q in self.queues.items()}, "next_seq": self.next_seq,
                "any_hot": self.any_hot, "recent": self.recent}

    def load_state(self, st: dict[str, Any] | None) -> None:
        self._reset()
        if not st:
            return
        self.buffer = EventBatch(np.asarray(st["ts"], np.int64), np.asarray(st["labels"], np.float32),
                                 np.asarray(st["dense"], np.float32).reshape(len(st["labels"]), self.dense_dim),
                                 {f: JaggedIds(np.asarray(v, np.int64), np.asarray(o, np.int64))
                                  for f, (v, o) in st["sparse"].items()})
        if st.get("feedback") is not None:
            self.buffer.feedback = np.asarray(st["feedback"], np.int8)
        if st.get("request_ids") is not None:
            self.buffer.request_ids = list(st["request_ids"])
        if st.get("task_labels") is not None:
            self.buffer.task_labels = np.asarray(st["task_labels"], np.float32).reshape(len(st["labels"]), -1) \
                if len(st["labels"]) else np.zeros((0, self.num_tasks), np.float32)
        self.seq, self.hot = np.asarray(st["seq"], np.int64), np.asarray(st["hot"], bool)
        n = len(self.seq)  # checkpoints from before sources were kept: unknown (-1)
        self.part = np.asarray(st["part"], np.int32) if "part" in st else np.full(n, -1, np.int32)
        self.off = np.asarray(st["off"], np.int64) if "off" in st else np.full(n, -1, np.int64)
        # [N] in a checkpoint from before tasks: [N, 1]
        self.scores = np.asarray(st["scores"], np.float32).reshape(len(self.seq), self.num_tasks)
        self.scored = np.asarray(st["scored"], bool)
        self.queues = {k: [int(p) for p in q] for k, q in st["queues"].items()}
        self.next_seq = int(st["next_seq"])
        self.any_hot = bool(st.get("any_hot", self.hot.any()))
        self.recent = np.asarray(st.get("recent", np.zeros(0, bool)), bool)


_INF = 1 << 62


def _within(at: int, left: int) -> int:
    """``at`` (arrivals from now, 0 if already due) when it falls among the ``left`` arrivals at hand, else ``_INF``."""
    at = max(0, at)
    return at if at < left else _INF


def _first_reaching(cum: np.ndarray, need: int) -> int:
    """Index of the first element of a running count that reaches ``need`` (``_INF``: none does)."""
    if len(cum) == 0 or cum[-1] < need:
        return _INF
    return int(np.searchsorted(cum, need))
