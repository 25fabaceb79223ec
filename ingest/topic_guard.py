"""What a consumer checks about its topic between polls: the topic's identity, its partitions, lost offsets.

:class:`TopicGuard` sees a topic deleted and recreated under the same name (its topic id changed: every
position in it is meaningless now), a topic that gained partitions (in assign mode they are read from their
start; a group rank's fixed share reports the change in ``partitions_changed`` instead, so the group
re-plans) and positions the log no longer holds. A lost position is never skipped silently:
``kafka.on_offsets_lost`` decides, and ``fail`` raises :class:`OffsetsLostError` with a message saying what
was expected, what was found, and how to go on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, get_args

from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kafka_errors

from streamrec.foundation import StreamrecError

from .ingest_types import OffsetsLostPolicy

if TYPE_CHECKING:
    from .consumer_stats import ConsumerStats

log = logging.getLogger(__name__)

OFFSETS_LOST_POLICIES = get_args(OffsetsLostPolicy)  # kafka.on_offsets_lost


class OffsetsLostError(StreamrecError, RuntimeError):
    """The log no longer holds the position to resume from (``kafka.on_offsets_lost = fail``)."""


def topic_id(consumer: KafkaConsumer, topic: str):
    """The topic's id (uuid) in the client's metadata cache, or None (not seen yet, or a client or broker
    without topic ids). A topic deleted and recreated under the same name gets a new id."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)  # kafka-python's metadata cache
    try:
        return cluster.topic_id(topic) if cluster is not None else None
    except Exception:  # an older client without topic ids: the out-of-range check still holds
        return None


def offsets_lost_message(topic: str, partition: int, expected: int | None, begin: int | None, end: int | None,
                         why: str) -> str:
    """One line for the operator: what was expected, what was found, how to go on."""
    held = f"[{begin}, {end})" if begin is not None else "unknown"
    return (f"{topic}[{partition}]: expected to resume at offset {expected}, the log now holds offsets {held} "
            f"({why}); events between may be lost. To go on, set kafka.on_offsets_lost=earliest (re-read the "
            f"partition from its start) or =latest (skip to its end), e.g. --set kafka.on_offsets_lost=earliest")


class TopicGuard:
    """Checks ``topic`` as read by the client ``kc``.

    ``positions`` is the consumer's own map (partition -> the offset after the last record handed out):
    the guard reads it to name what was expected and writes the new position of every partition it moves.
    ``forget`` drops the consumer's unread records of partitions the guard re-seeks. ``fixed``: a group
    rank's static share of partitions (assign mode), None for every partition.
    """

    def __init__(self, kc: KafkaConsumer, topic: str, mode: str, policy: OffsetsLostPolicy, stats: "ConsumerStats",
                 positions: dict[tuple[str, int], int], forget: Callable[[list], None],
                 fixed: set[int] | None = None):
        self.kc = kc
        self.topic = topic
        self.mode = mode
        self.policy = policy
        self.stats = stats
        self.positions = positions
        self.forget = forget
        self.fixed = fixed
        self.topic_id = None  # the topic's id (uuid) when first seen: a new id means it was recreated
        self.known_partitions: set[int] = set()
        self.partitions_changed: tuple[int, int] | None = None  # (had, has) when a fixed share no longer fits

    def start(self) -> None:
        """Note the topic's id and partitions as they are now (after the first assignment)."""
        self.topic_id = topic_id(self.kc, self.topic)
        self.known_partitions = set(self.kc.partitions_for_topic(self.topic) or ())

    def check(self) -> None:
        """A topic deleted and recreated gets a new id: every position in it is meaningless now. A topic that
        gained partitions (added, or auto-created anew with the broker's default count) has records nobody
        reads unless they are assigned: in assign mode they are taken too (from their start)."""
        self._check_partitions()
        now = topic_id(self.kc, self.topic)
        if now is None:
            return
        if self.topic_id is None:
            self.topic_id = now
            return
        if now != self.topic_id:
            old, self.topic_id = self.topic_id, now
            owned = [tp for tp in self.kc.assignment() if tp.topic == self.topic]
            self.apply_offsets_lost({tp: self.positions.get((tp.topic, tp.partition)) for tp in owned},
                                    f"the topic was deleted and recreated: id {old} is now {now}")

    def _check_partitions(self) -> None:
        if self.mode != "assign":
            return  # the consumer group assigns new partitions itself
        parts = set(self.kc.partitions_for_topic(self.topic) or ())  # the client's metadata cache
        added = parts - self.known_partitions
        if not parts or not added:
            return
        had = len(self.known_partitions)
        self.known_partitions = parts
        if self.fixed is not None:  # a group rank's static share: the group must re-plan (it restarts)
            self.partitions_changed = (had, len(parts))
            log.warning("topic %s now has %d partitions (had %d): this rank's static share no longer covers them",
                        self.topic, len(parts), had)
            return
        tps = [TopicPartition(self.topic, p) for p in sorted(added)]
        self.kc.assign(sorted(self.kc.assignment() | set(tps), key=lambda tp: (tp.topic, tp.partition)))
        self.kc.seek_to_beginning(*tps)
        for tp in tps:
            self.positions[(tp.topic, tp.partition)] = int(self.kc.position(tp))
        self.stats.partitions_added += len(tps)
        log.warning("topic %s gained partitions %s (now %d): reading them from their start", self.topic,
                    sorted(added), len(parts))

    def apply_offsets_lost(self, lost: dict, why: str, begin: dict | None = None,
                           end: dict | None = None) -> dict:
        """Apply ``on_offsets_lost`` to partitions whose position the log no longer holds (``lost``:
        TopicPartition -> the offset expected there). ``fail`` raises :class:`OffsetsLostError` naming
        them all; else each is moved to the log's start or end: ``{TopicPartition: offset}``."""
        kc = self.kc
        tps = [tp for tp in lost if isinstance(tp, TopicPartition)]
        if not tps:
            return {}
        if begin is None or end is None:
            try:
                begin, end = kc.beginning_offsets(tps), kc.end_offsets(tps)
            except kafka_errors.KafkaError:
                begin, end = {}, {}
        msgs = [offsets_lost_message(tp.topic, tp.partition, lost[tp], begin.get(tp), end.get(tp), why) for tp in tps]
        if self.policy == "fail":
            raise OffsetsLostError("; ".join(msgs))
        self.forget(tps)
        moved = {}
        for tp, msg in zip(tps, msgs):
            if self.policy == "earliest":
                kc.seek_to_beginning(tp)
            else:
                kc.seek_to_end(tp)
            moved[tp] = self.positions[(tp.topic, tp.partition)] = int(kc.position(tp))
            self.stats.offsets_reset += 1
            log.warning("%s -> resuming at offset %d (kafka.on_offsets_lost=%s)", msg, moved[tp], self.policy)
        return moved
