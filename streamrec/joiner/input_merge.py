"""Event-time order within a partition: the impressions and actions fetched for it, merged by event time.

A Kafka reader hands a partition's two topics over in whatever order its fetches come back (during a
backlog, thousands of one topic's records before the other's), and the join emits a positive when its
action is joined, so without a merge a positive lands as far after its fake negative as the fetches
happened to put it. :class:`InputMerge` sits between the reader and the join of one partition, on the
rule the trainer's partition merge (``streamrec.trainer.merge``) applies to event partitions, but for its
start (the trainer's counts its start as a delivery; this one takes only the reader's word then):

- each topic's records wait in their own queue, in offset order; a record's *key* is the running
  maximum of ``ts`` over its topic (continued from the join's watermark of that topic), so each topic is
  released in its own offset order and the join's per-topic rules see exactly the topic's order; a record
  without a readable ``ts`` (malformed: it goes to the dead letters) takes the running maximum;
- the head with the smaller key is released first (ties: the impression, which precedes its actions);
- while one topic's queue is empty, the other waits as long as the empty topic *holds*: the reader knows
  it has records not fetched yet (its position is below the broker's high watermark, or no fetch of it
  answered yet), bounded by ``10 x wait`` since it last delivered (or since the merge started), or it
  delivered within ``wait`` (``join.merge_wait_ms``: a topic that is streaming holds the other between its
  fetches). A topic that delivered nothing since the merge started holds only by what the reader knows, so
  a restarted worker whose reader finds a topic caught up joins the other at once;
- a record weighs what ``weight(item)`` says (an Arrow record of many impressions: their count), and the
  batch limits of :meth:`InputMerge.release` and :meth:`InputMerge.waiting` count weight, so a batch's
  state and the queues stay bounded in impressions, not messages;
- nothing here is durable: the join commits the offsets of the records it joined, never of records
  waiting here, so a restart reads those again.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable


class InputMerge:
    """One partition's two input topics; ``first`` wins ties. ``newest``: each topic's running ``ts`` maximum
    so far (the join's watermarks; None: nothing joined yet). ``weight(item)``: what one record counts
    for in the batch limits (1 when not given)."""

    def __init__(self, first: str, second: str, newest: dict[str, int | None], wait_s: float,
                 clock: Callable[[], float] = time.monotonic, weight: Callable[[Any], int] | None = None):
        self.first, self.second = first, second
        self.weight = weight
        self.wait_s = max(0.0, float(wait_s))
        self.clock = clock
        self.clear(newest)

    def clear(self, newest: dict[str, int | None]) -> None:
        """Drop every queued record; the running maxima continue from ``newest``, the waits start now."""
        self.queues: dict[str, deque] = {self.first: deque(), self.second: deque()}  # (key, item, weight)
        self.weights: dict[str, int] = {self.first: 0, self.second: 0}  # each queue's total weight
        self.newest: dict[str, int | None] = {t: newest.get(t) for t in (self.first, self.second)}
        self.started = self.clock()
        self.last: dict[str, float | None] = {self.first: None, self.second: None}  # last delivery (None: none yet)

    def __len__(self) -> int:
        return len(self.queues[self.first]) + len(self.queues[self.second])

    def waiting(self, topic: str) -> int:
        """The total weight of ``topic``'s queued records."""
        return self.weights[topic]

    def add(self, topic: str, items: list[tuple[int | None, Any]], now: float | None = None) -> None:
        """Queue one fetch of ``topic``: ``(ts, item)`` in offset order (ts None: not readable)."""
        if not items:
            return
        q, top, weight = self.queues[topic], self.newest[topic], self.weight
        for ts, item in items:
            if ts is not None and (top is None or ts > top):
                top = ts
            w = 1 if weight is None else weight(item)
            q.append((top, item, w))
            self.weights[topic] += w
        self.newest[topic] = top
        self.last[topic] = self.clock() if now is None else now

    def holds(self, topic: str, behind: bool, now: float | None = None) -> bool:
        """Whether ``topic``, its queue empty, holds the other topic back (``behind``: the reader knows of
        records of it not fetched yet, or has no answer about it yet)."""
        now = self.clock() if now is None else now
        last = self.last[topic]
        if last is None:
            return behind and now - self.started < 10 * self.wait_s
        quiet = now - last
        return quiet < self.wait_s or (behind and quiet < 10 * self.wait_s)

    def release(self, limit: int, holding: Callable[[str], bool]) -> list[tuple[str, Any]]:
        """``(topic, item)`` in merged order, up to ``limit`` of weight (at least one record, whatever it
        weighs); ``holding(topic)`` is asked when that topic's queue is empty and the other's is not."""
        out: list[tuple[str, Any]] = []
        a, b = self.queues[self.first], self.queues[self.second]
        held: dict[str, bool] = {}
        taken = 0
        while taken < limit:
            if a and b:
                take = self.first if a[0][0] is None or (b[0][0] is not None and a[0][0] <= b[0][0]) else self.second
            elif a or b:
                empty = self.second if a else self.first
                if empty not in held:
                    held[empty] = holding(empty)
                if held[empty]:
                    break
                take = self.first if a else self.second
            else:
                break
            q = self.queues[take]
            if out and taken + q[0][2] > limit:
                break
            _, item, w = q.popleft()
            self.weights[take] -= w
            taken += w
            out.append((take, item))
        return out
