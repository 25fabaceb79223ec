"""Partition order: merge the partitions a trainer reads by event time, with a bounded wait.

A Kafka consumer hands partitions over one after another (during a backlog, a whole partition's
fetch before the next one's), and an unkeyed producer spreads events over partitions unevenly, so
without a merge the training order is far from the stream's time order, and progressive AUC
pays for it. :class:`PartitionMerger` sits between the consumer and ``TrainerCore.feed``:

- events wait in one buffer, each tagged with its partition and its record's offset
  (``EventBatch.source_partitions``, ``source_records``: int arrays, carried to the batcher, so the
  crash-loop marker of a training step names exactly its records);
- each event's *key* is the running maximum of ``ts`` over its partition's waiting events in
  arrival order, so every partition is released in its own offset order (a partition whose
  times are not monotonic is never reordered inside itself) and with one partition the merge
  changes nothing;
- the *watermark* is the smallest newest-``ts`` over the partitions that still *hold*: a
  partition holds while the consumer knows it has records not handed out yet (``behind``), or
  while it has delivered something within ``wait_ms`` (or, never having delivered, within
  ``wait_ms`` of the start). Events whose key is below the watermark are released, in key order
  (ties: partition, then arrival), so a deterministic merge of a backlog;
- bounds: a partition quiet for ``wait_ms`` no longer holds the others back, an event is
  released anyway once ``max_events`` events arrived after it (memory, and a far-future ``ts``),
  and a quiet stream, the end of the stream and a stop release everything.

Events waiting here are received but not trained: the checkpoint holds them (``state``), as it
holds the batcher's pending events, so the offsets it commits may cover them.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

import numpy as np

from streamrec.foundation import EventBatch, JaggedIds

_NONE = np.iinfo(np.int64).min  # the newest ts of a partition that has delivered nothing


class PartitionMerger:
    def __init__(self, wait_ms: float, max_events: int, dense_dim: int, fields: Sequence[str],
                 clock=time.monotonic):
        self.wait_s = max(0.0, float(wait_ms)) / 1000.0
        self.max_events = max(1, int(max_events))
        self.dense_dim, self.fields = int(dense_dim), list(fields)
        self.clock = clock
        self.started = clock()
        self.last: dict[int, float] = {}  # partition -> when it last delivered (monotonic seconds)
        self.newest: dict[int, int] = {}  # partition -> its newest ts seen
        self.forced = 0  # events released by the max_events bound, not by the watermark
        self._reset()

    @property
    def enabled(self) -> bool:
        return self.wait_s > 0

    def _reset(self) -> None:
        self.buffer = EventBatch.empty(self.dense_dim, self.fields)
        self.part = np.zeros(0, np.int32)
        self.off = np.zeros(0, np.int64)  # each event's record offset (-1: unknown)
        self.seq = np.zeros(0, np.int64)  # arrival number (for max_events and ties)
        self.next_seq = 0

    def __len__(self) -> int:
        return len(self.buffer)

    def expect(self, partitions: Iterable[int]) -> None:
        """Partitions this trainer reads: each holds the others back until it delivers or ``wait_ms`` passed."""
        for p in partitions:
            self.newest.setdefault(int(p), _NONE)

    def add(self, batch: EventBatch, now: float | None = None) -> None:
        """Buffer a polled batch (its events tagged with their partitions)."""
        n = len(batch)
        if n == 0:
            return
        now = self.clock() if now is None else now
        parts = batch.source_partitions
        if parts is None:  # no partition known (not from Kafka): one source
            parts = np.full(n, -1, np.int32)
        parts = np.asarray(parts, np.int32)
        offs = batch.source_records
        offs = np.full(n, -1, np.int64) if offs is None else np.asarray(offs, np.int64)
        for p in np.unique(parts):
            p = int(p)
            self.last[p] = now
            self.newest[p] = max(self.newest.get(p, _NONE), int(batch.ts[parts == p].max()))
        b = EventBatch(batch.ts, batch.labels, batch.dense, batch.sparse, batch.request_ids, feedback=batch.feedback,
                       task_labels=batch.task_labels, task_names=batch.task_names)
        self.buffer = EventBatch.concat([self.buffer, b], self.dense_dim, self.fields) if len(self.buffer) else b
        self.part = np.concatenate([self.part, parts])
        self.off = np.concatenate([self.off, offs])
        self.seq = np.concatenate([self.seq, self.next_seq + np.arange(n, dtype=np.int64)])
        self.next_seq += n

    def watermark(self, now: float, behind: Iterable[int] = ()) -> float:
        """Events keyed below this are released (+inf: no partition holds)."""
        behind = set(behind)
        holding = [ts for p, ts in self.newest.items()
                   if p in behind or now - self.last.get(p, self.started) < self.wait_s]
        if not holding:
            return float("inf")
        w = min(holding)
        return float("-inf") if w == _NONE else float(w)

    def release(self, now: float | None = None, behind: Iterable[int] = ()) -> EventBatch | None:
        """The events that may go to training now, in merged order (None: none)."""
        if not len(self.buffer):
            return None
        now = self.clock() if now is None else now
        w = self.watermark(now, behind)
        if w == float("inf"):
            return self.drain()
        keys = self._keys()
        go = keys < w
        force = self.seq < self.next_seq - self.max_events
        self.forced += int((force & ~go).sum())
        return self._take(go | force, keys)

    def drain(self) -> EventBatch | None:
        """Everything waiting, in merged order (quiet stream, end of stream, stop)."""
        if not len(self.buffer):
            return None
        return self._take(np.ones(len(self.buffer), bool), self._keys())

    def _keys(self) -> np.ndarray:
        """Per event: the running max of ts over its partition's waiting events, in arrival order."""
        keys = np.empty(len(self.buffer), np.int64)
        ts = self.buffer.ts
        for p in np.unique(self.part):
            at = np.flatnonzero(self.part == p)
            keys[at] = np.maximum.accumulate(ts[at])
        return keys

    def _take(self, mask: np.ndarray, keys: np.ndarray) -> EventBatch | None:
        rows = np.flatnonzero(mask)
        if not len(rows):
            return None
        rows = rows[np.lexsort((self.seq[rows], self.part[rows], keys[rows]))]
        out = self.buffer.take(rows)
        out.source_partitions, out.source_records = self.part[rows], self.off[rows]
        keep = np.flatnonzero(~mask)
        self.buffer = self.buffer.take(keep)
        self.part, self.off, self.seq = self.part[keep], self.off[keep], self.seq[keep]
        return out

    def remove(self, rows: np.ndarray) -> EventBatch:
        """Take these waiting events out (never trained: restored events whose records crashed a training
        step); returns them, with their sources."""
        mask = np.zeros(len(self.buffer), bool)
        mask[rows] = True
        out = self.buffer.take(np.flatnonzero(mask))
        out.source_partitions, out.source_records = self.part[mask], self.off[mask]
        keep = np.flatnonzero(~mask)
        self.buffer = self.buffer.take(keep)
        self.part, self.off, self.seq = self.part[keep], self.off[keep], self.seq[keep]
        return out

    # -- checkpoint ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        b = self.buffer
        return {"ts": b.ts, "labels": b.labels, "dense": b.dense, "feedback": b.feedback, "request_ids": b.request_ids,
                "task_labels": b.task_labels, "task_names": list(b.task_names) if b.task_names else None,
                "sparse": {f: (b.sparse[f].values, b.sparse[f].offsets) for f in self.fields},
                "part": self.part, "off": self.off, "seq": self.seq, "next_seq": self.next_seq,
                "newest": {int(p): int(t) for p, t in self.newest.items()}}

    def load_state(self, st: dict[str, Any] | None) -> None:
        """Restore waiting events; every partition's wait starts again now."""
        self._reset()
        self.started = self.clock()
        self.last = {}
        if not st:
            return
        n = len(st["labels"])
        self.buffer = EventBatch(np.asarray(st["ts"], np.int64), np.asarray(st["labels"], np.float32),
                                 np.asarray(st["dense"], np.float32).reshape(n, self.dense_dim),
                                 {f: JaggedIds(np.asarray(v, np.int64), np.asarray(o, np.int64))
                                  for f, (v, o) in st["sparse"].items()},
                                 request_ids=list(st["request_ids"]) if st.get("request_ids") is not None else None,
                                 feedback=np.asarray(st["feedback"], np.int8) if st.get("feedback") is not None else None,
                                 task_labels=(np.asarray(st["task_labels"], np.float32).reshape(n, -1)
                                              if st.get("task_labels") is not None else None),
                                 task_names=tuple(st["task_names"]) if st.get("task_names") else None)
        self.part, self.seq = np.asarray(st["part"], np.int32), np.asarray(st["seq"], np.int64)
        self.off = np.asarray(st["off"], np.int64) if "off" in st else np.full(n, -1, np.int64)
        self.next_seq = int(st["next_seq"])
        self.newest = {int(p): int(t) for p, t in st.get("newest", {}).items()}
