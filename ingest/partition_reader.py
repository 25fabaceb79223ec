"""The consumer's reading side: client polls, the buffer of polled records, and each partition's position.

:class:`PartitionReader` polls the Kafka client on every call, pausing its partitions while it still
holds unread records (back-pressure), so a slow caller stays in its group without fetching more than it
reads. It keeps, per partition, the offset after the last record handed out (``positions``): a partition
assigned to it, at the start or after a rebalance, resumes there (never at an older commit, never past a
record not handed out), else at the group's committed offset, else at the log's start. Records fetched
from positions a rebalance replaced are dropped, never handed out twice or out of order.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka import errors as kafka_errors

from streamrec.foundation import StreamrecError

from .fast_records import RecordRun

if TYPE_CHECKING:
    from .consumer_stats import ConsumerStats

log = logging.getLogger(__name__)


def _by_partition(tps) -> list:
    return sorted(tps, key=lambda tp: (tp.topic, tp.partition))


class _Rebalance(ConsumerRebalanceListener):
    """Notes what a rebalance changed; the reader acts on it after the poll, on its own thread
    (kafka-python calls listeners on its network thread, where blocking calls are not allowed)."""

    def __init__(self, owner: "PartitionReader"):
        self.owner = owner

    def on_partitions_revoked(self, revoked):
        self.owner.revoked.update(revoked)

    def on_partitions_assigned(self, assigned):
        self.owner.assigned.update(assigned)


class PartitionReader:
    """Reads ``topic`` through the client ``kc``.

    ``fast_records``: the client hands out :class:`~.fast_records.RecordRun` lists (else kafka-python's
    record lists, turned into one run each). ``max_pending``: unread records held before partitions are
    paused. ``offsets_lost(lost, why)`` is called when the broker says a position is out of range
    (``lost``: TopicPartition -> the offset expected there); it decides where the partition goes on.
    """

    def __init__(self, kc: KafkaConsumer, topic: str, stats: "ConsumerStats", max_pending: int,
                 fast_records: bool, offsets_lost: Callable[[dict, str], object]):
        self.kc = kc
        self.topic = topic
        self.stats = stats
        self.max_pending = max_pending
        self.fast_records = fast_records
        self.offsets_lost = offsets_lost
        self.pending: collections.deque = collections.deque()  # polled, not yet handed out (runs, in order)
        self.positions: dict[tuple[str, int], int] = {}  # the offset after the last record handed out (or sought)
        self.revoked: set = set()  # noted by the rebalance listener, handled after the poll
        self.assigned: set = set()
        self._assigned_once = False

    # -- taking partitions -------------------------------------------------------------

    def subscribe(self) -> None:
        """Join the consumer group for the topic (mode "group")."""
        self.kc.subscribe([self.topic], listener=_Rebalance(self))

    def assign(self, partitions: Sequence[int] | None, wait_s: float = 30) -> None:
        """Take ``partitions`` (every partition when None) once the topic exists (mode "assign")."""
        parts = None
        deadline = time.monotonic() + wait_s
        while not parts:
            parts = self.kc.partitions_for_topic(self.topic)
            if not parts:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {self.topic!r} does not exist")
                time.sleep(0.2)
        if partitions is not None:
            missing = sorted(set(partitions) - set(parts))
            if missing:
                raise StreamrecError(f"topic {self.topic!r} has partitions {sorted(parts)}; partitions "
                                     f"{missing} asked for do not exist")
            parts = set(partitions)
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.kc.assign(tps)
        self._on_assigned(tps)

    def wait_for_assignment(self, timeout_s: float, stop: threading.Event | None = None) -> list:
        """Poll (fetching nothing) until the group assigns partitions; [] when ``stop`` is set.
        Raises RuntimeError after ``timeout_s`` without an assignment."""
        deadline = time.monotonic() + timeout_s
        while not self.kc.assignment():
            if stop is not None and stop.is_set():
                return []
            if time.monotonic() > deadline:
                raise RuntimeError(f"no partitions of {self.topic!r} assigned within {timeout_s:.0f} s")
            self.poll(200, pause=True)
        return _by_partition(self.kc.assignment())

    # -- polling -----------------------------------------------------------------------

    def poll(self, timeout_ms: int, pause: bool) -> dict:
        """One client poll. ``pause``: hold every partition (unread records are still held) so the poll
        keeps the group membership without fetching more; what arrives anyway joins ``pending``, and {} is
        returned. Else resume them and fetch: ``{TopicPartition: [RecordRun, ...]}``."""
        kc = self.kc
        owned = kc.assignment()
        if pause:
            if owned:
                kc.pause(*owned)
        elif kc.paused():
            kc.resume(*kc.paused())
        try:
            polled = kc.poll(timeout_ms=timeout_ms, max_records=2000)
        except kafka_errors.OffsetOutOfRangeError as e:
            lost = e.args[0] if e.args and isinstance(e.args[0], dict) else {}
            self.offsets_lost(lost, "the broker says the offset is out of range")
            return {}
        except kafka_errors.NoOffsetForPartitionError:  # assigned, never committed: position it ourselves
            self.assigned.update(kc.assignment())
            polled = {}
        if self.revoked or self.assigned:
            revoked, self.revoked = self.revoked, set()
            assigned, self.assigned = self.assigned, set()
            self.forget(revoked)
            if assigned:
                self._on_assigned(_by_partition(assigned))
            # records fetched from positions just replaced (the group's older commit) are not ours
            polled = {tp: recs for tp, recs in polled.items() if tp not in assigned and tp not in revoked}
        if not self.fast_records:  # kafka-python's ConsumerRecord lists: one run each
            polled = {tp: [RecordRun.of_records(recs)] for tp, recs in polled.items() if recs}
        if pause:  # fetched before the pause took effect: keep them, in order, after what is held
            self.pending.extend(run for runs in polled.values() for run in runs)
            return {}
        if sum(map(len, self.pending)) > self.max_pending and owned:
            kc.pause(*owned)
        return polled

    def take(self, k: int) -> list:
        """Up to ``k`` records from the front of ``pending``, as runs (the last one split if needed).
        The caller records them as handed out (``positions``)."""
        out = []
        pending = self.pending
        while k > 0 and pending:
            run = pending[0]
            if len(run) <= k:
                out.append(pending.popleft())
                k -= len(run)
            else:
                head, pending[0] = run.split(k)
                out.append(head)
                k = 0
        return out

    def forget(self, partitions) -> None:
        """Drop unread records of partitions no longer owned (or about to be re-sought)."""
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if gone and self.pending:
            self.pending = collections.deque(r for r in self.pending if (r.topic, r.partition) not in gone)

    def _on_assigned(self, partitions) -> None:
        """Position newly assigned partitions: where this reader left off, else the committed offset,
        else the start of the log."""
        kc = self.kc
        tps = [tp for tp in partitions if tp.topic == self.topic]
        if self._assigned_once:
            self.stats.rebalances += 1
        self._assigned_once = True
        self.forget(tps)
        begin = None
        for tp in tps:
            key = (tp.topic, tp.partition)
            off = self.positions.get(key)
            if off is None:
                try:
                    off = kc.committed(tp)
                except kafka_errors.KafkaError as e:
                    log.warning("committed offset of %s[%d] unavailable (%s); starting at the log start",
                                tp.topic, tp.partition, e)
                    off = None
            if off is None:
                if begin is None:
                    begin = kc.beginning_offsets(tps)
                off = begin[tp]
            kc.seek(tp, off)
            self.positions[key] = int(off)

    # -- positions ---------------------------------------------------------------------

    def set_positions(self, offsets: dict[tuple[str, int], int]) -> None:
        """Resume these partitions at these offsets, now and after any rebalance."""
        self.forget([TopicPartition(t, p) for t, p in offsets])
        owned = self.kc.assignment()
        for (t, p), o in offsets.items():
            self.positions[(t, p)] = int(o)
            tp = TopicPartition(t, p)
            if tp in owned:
                self.kc.seek(tp, int(o))

    def partitions_behind(self) -> set[int]:
        """Partitions of the topic with records not handed out yet, as far as the last fetch's high
        watermark tells (no broker round trip): records held here, or records no fetch has brought yet. A
        transaction's marker is no record: a partition whose fetch passed it and that holds nothing is not
        behind, though its last offset is never handed out."""
        held = {run.partition for run in self.pending if run.topic == self.topic}
        out = set()
        for tp in self.kc.assignment():
            hw = self.kc.highwater(tp)
            if tp.topic != self.topic or hw is None or self.positions.get((tp.topic, tp.partition), hw) >= hw:
                continue
            at = self._fetched_to(tp)
            if tp.partition in held or at is None or at < hw:
                out.add(tp.partition)
        return out

    def fetch_behind(self) -> bool:
        """Whether a fetch's high watermark shows records of the topic that no fetch has brought yet (the
        client's fetch position short of it; a transaction's marker is no record to wait for: the fetch
        position passes it). Records fetched and not handed out yet are :attr:`pending`'s, not counted here."""
        for tp in self.kc.assignment():
            hw = self.kc.highwater(tp)
            if tp.topic == self.topic and hw is not None:
                at = self._fetched_to(tp)
                if at is not None and at < hw:
                    return True
        return False

    def _fetched_to(self, tp) -> int | None:
        """The client's fetch position of ``tp`` (None: it has none); assigned partitions are positioned, so
        this makes no round trip."""
        return self.kc.position(tp, timeout_ms=0)

    def lag(self) -> dict[int, int] | None:
        """Records not yet handed out per assigned partition (partition -> records, up to the topic head,
        held ones included); None when the broker could not say.

        The head is the last fetch's high watermark, which every fetch response carries: asking the broker
        (ListOffsets) is a round trip in the training loop, and on a saturated link it waits behind the
        fetches. Only a partition no fetch has answered for yet is asked about."""
        assigned = list(self.kc.assignment())
        if not assigned:
            return {}
        try:
            ends = {tp: self.kc.highwater(tp) for tp in assigned}
            unknown = [tp for tp, hw in ends.items() if hw is None]
            if unknown:
                ends.update(self.kc.end_offsets(unknown))
            held = collections.Counter()  # polled but not yet handed out
            for run in list(self.pending):
                held[run.partition] += len(run)
            return {tp.partition: max(0, (ends[tp] or 0) - self.kc.position(tp)) + held.get(tp.partition, 0)
                    for tp in assigned}
        except Exception:  # lag is informational only
            return None
