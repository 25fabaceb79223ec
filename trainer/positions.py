"""Where the trainer reads the events topic from, and where a finite replay stops.

:func:`position_consumer` resumes every assigned partition at the checkpoint's offset, else the
committed one, else the log's start; after a checkpoint was refused (``fell_back``) a partition the
checkpoint does not name starts at the log's start, never at a commit of the refused, newer checkpoint.
The checkpoint's offsets mean something only in the topic they were read from: when the topic's id
differs from the checkpoint's (deleted and recreated), ``kafka.on_offsets_lost`` decides (fail, or start
over at the log's start or end).

:class:`StreamEnd` (``trainer.until_end``) is the end of every assigned partition as of the start: the
run is over once each was read up to it.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


def position_consumer(consumer, offsets: dict[tuple[str, int], int], topic_ids: dict[str, str],
                      fell_back: bool, stop: threading.Event, max_poll_interval_ms: int) -> dict[tuple[str, int], int]:
    """Position ``consumer`` (an ``EventConsumer``) once the group assigned it partitions: ``{(topic,
    partition): offset}`` for each, {} when ``stop`` was set before any assignment. ``offsets`` and
    ``topic_ids`` are the checkpoint's; the assignment is awaited three ``kafka.max_poll_interval_ms``
    (at least a minute)."""
    from kafka import TopicPartition

    c = consumer
    kc = c.consumer
    tps = c.wait_for_assignment(max(60.0, max_poll_interval_ms / 1000 * 3), stop)
    if not tps:  # stopped (SIGTERM) before the group assigned anything: the run exits as "stopped"
        return {}
    begin, end = kc.beginning_offsets(tps), kc.end_offsets(tps)
    recreated = (topic_ids.get(c.topic) and c.topic_id is not None and str(c.topic_id) != topic_ids[c.topic])
    moved = {}
    if recreated:  # the checkpoint's offsets are of another topic: kafka.on_offsets_lost decides
        lost = {tp: offsets[(tp.topic, tp.partition)] for tp in tps if (tp.topic, tp.partition) in offsets}
        why = f"the topic was deleted and recreated since the checkpoint: id {topic_ids[c.topic]} is now " \
              f"{c.topic_id}"
        moved = c.apply_offsets_lost(lost, why, begin, end)
    pos = {}
    for tp in tps:
        key = (tp.topic, tp.partition)
        if tp in moved:
            off = moved[tp]
        elif key in offsets:
            off = offsets[key]  # beyond the log end, the first fetch says so and on_offsets_lost decides
        elif fell_back:  # commits may come from the refused, newer checkpoint: never skip past them
            off = begin[tp]
        else:
            committed = kc.committed(TopicPartition(tp.topic, tp.partition))
            off = committed if committed is not None else begin[tp]
        pos[key] = int(off)
    c.set_positions(pos)
    return pos


class StreamEnd:
    """The end offset of every partition in ``pos`` as the client ``kc`` sees it now.

    Raised to the high watermark of each partition's first fetch: some brokers (the embedded tansu)
    answer ListOffsets with less than the log end after batched produces."""

    def __init__(self, kc, pos: dict[tuple[str, int], int]):
        from kafka import TopicPartition

        self.kc = kc
        tps = [TopicPartition(t, p) for t, p in pos]
        ends = kc.end_offsets(tps) if tps else {}
        self.seen: set = set()  # partitions whose first fetch's high watermark is in ``end_at``
        self.end_at = {(tp.topic, tp.partition): int(off) for tp, off in ends.items()}
        log.info("until_end: stopping at the end of the stream as of now: %s",
                 {f"{t}:{p}": o for (t, p), o in sorted(self.end_at.items())})

    def reached(self, pos: dict[tuple[str, int], int], quiet: bool = False) -> bool:
        """Every partition read (``pos``: the next offset per partition) up to its end; ``quiet`` (the last
        poll brought nothing) also counts a partition whose high watermark was never seen."""
        from kafka import TopicPartition

        for key in self.end_at:
            if key not in self.seen:
                hw = self.kc.highwater(TopicPartition(*key))
                if hw is not None:
                    self.end_at[key] = max(self.end_at[key], int(hw))
                    self.seen.add(key)
        return all(pos.get(k, 0) >= end and (quiet or k in self.seen) for k, end in self.end_at.items())
