"""Kafka producer and consumer wrappers for events, with the dead-letter path.

The consumer yields decoded columnar batches plus the offsets they came from and
commits offsets only when the caller says a batch is durable. A record that
fails to decode or validate is written to the dead-letter topic with the reason
and its original bytes, counted, and skipped; the DLQ producer is flushed before
any offset past it is committed, so nothing is dropped silently.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from streamrec.foundation import StreamrecError
from .codec import CODEC_HEADER, Decoder, encode_messages
from streamrec.foundation import EventBatch, EventSchema

log = logging.getLogger(__name__)

REASON_HEADER = "streamrec-error"
SOURCE_HEADER = "streamrec-source"


def make_producer(bootstrap: str, **overrides) -> KafkaProducer:
    opts = dict(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        batch_size=1 << 20,
        max_request_size=16 << 20,
        acks="all",
        retries=5,
        client_id="streamrec",
    )
    opts.update(overrides)
    return KafkaProducer(**opts)


class ProduceError(StreamrecError, RuntimeError):
    """The broker did not acknowledge some messages."""


class EventProducer:
    """Writes events to the events topic in the configured wire form."""

    def __init__(self, bootstrap: str, cfg, codec: str | None = None, producer: KafkaProducer | None = None):
        self.cfg = cfg
        self.schema = EventSchema.from_config(cfg)
        self.codec = codec or cfg.kafka.codec
        self.topic = cfg.kafka.events_topic
        self.producer = producer or make_producer(bootstrap)
        self.sent_messages = 0
        self.sent_events = 0
        self._rr = 0
        self._partitions: list[int] | None = None
        self.failed = 0  # messages the broker did not take (reported by flush)
        self.last_error: Exception | None = None

    def _on_error(self, exc: Exception) -> None:
        self.failed += 1
        self.last_error = exc

    def _next_partition(self) -> int | None:
        if self._partitions is None:
            parts = self.producer.partitions_for(self.topic)
            self._partitions = sorted(parts) if parts else []
        if not self._partitions:
            return None
        self._rr = (self._rr + 1) % len(self._partitions)
        return self._partitions[self._rr]

    def send_batch(self, batch: EventBatch) -> int:
        """Encode and send a batch; returns the number of Kafka messages written."""
        msgs = encode_messages(batch, self.schema, self.codec, self.cfg.kafka.events_per_message)
        headers = [(CODEC_HEADER, self.codec.encode())]
        for m in msgs:
            self.producer.send(self.topic, m, partition=self._next_partition(), headers=headers).add_errback(
                self._on_error)
        self.sent_messages += len(msgs)
        self.sent_events += len(batch)
        return len(msgs)

    def send_raw(self, value: bytes, key: bytes | None = None) -> None:
        """Send bytes as they are (a third-party JSON event, or a bad record in tests)."""
        self.producer.send(self.topic, value, key=key, partition=self._next_partition()).add_errback(self._on_error)
        self.sent_messages += 1

    def flush(self, timeout: float | None = 60) -> None:
        """Wait until every message is acknowledged; raise if any was refused (never lose events silently)."""
        self.producer.flush(timeout)
        if self.failed:
            raise ProduceError(f"{self.failed} of {self.sent_messages} messages to {self.topic!r} failed: "
                               f"{self.last_error!r}")

    def close(self, timeout: float | None = 60) -> None:
        try:
            self.flush(timeout)
        finally:
            self.producer.close(timeout)


class DeadLetterError(StreamrecError, RuntimeError):
    """The dead-letter topic did not take a bad record: a caller must not record progress past it."""


@dataclass
class ConsumerStats:
    records: int = 0
    events: int = 0
    bytes: int = 0
    dead_letters: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)


class EventConsumer:
    """Consumes the events topic as decoded mini-batches.

    ``mode="group"`` joins the consumer group (partitions shared among trainers);
    ``mode="assign"`` takes every partition and still commits under the group id
    (one consumer, no group join: a quick start on brokers with slow joins).
    """

    def __init__(
        self,
        bootstrap: str,
        cfg,
        group_id: str,
        mode: str = "group",
        schema: EventSchema | None = None,
        dlq: bool = True,
        topic: str | None = None,
        **consumer_opts,
    ):
        if mode not in ("group", "assign"):
            raise ValueError(f"mode must be 'group' or 'assign', got {mode!r}")
        self.cfg = cfg
        self.topic = topic or cfg.kafka.events_topic
        self.dlq_topic = cfg.kafka.dlq_topic
        self.schema = schema or EventSchema.from_config(cfg)
        self.decoder = Decoder(self.schema)
        self.stats = ConsumerStats()
        self.mode = mode
        opts = dict(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=2000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=2_000,
            # also the group's rebalance timeout: brokers wait up to this long for members
            max_poll_interval_ms=cfg.kafka.max_poll_interval_ms,
            client_id=f"streamrec-{group_id}",
        )
        opts.update(consumer_opts)
        self.consumer = KafkaConsumer(**opts)
        if mode == "group":
            self.consumer.subscribe([self.topic])
        else:
            parts = None
            deadline = time.monotonic() + 30
            while not parts:
                parts = self.consumer.partitions_for_topic(self.topic)
                if not parts:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"topic {self.topic!r} does not exist")
                    time.sleep(0.2)
            self.consumer.assign([TopicPartition(self.topic, p) for p in sorted(parts)])
        self._dlq = make_producer(bootstrap) if dlq else None
        self._dlq_sent: list = []  # (send future or the error send raised, "topic:partition:offset") since the last flush
        self._per_record = 1.0  # events per record seen last time: how many records make max_events
        self._pending: collections.deque = collections.deque()  # polled, not yet decoded
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------

    def poll_batch(self, max_events: int, timeout: float = 1.0) -> EventBatch | None:
        """Return up to about ``max_events`` decoded events, or None if nothing arrived in ``timeout``.

        Records are pulled from the client in large polls and kept in a small local
        buffer between calls: each client poll costs a round trip to its network
        thread, which made many small polls several times slower than the fetch.
        """
        deadline = time.monotonic() + timeout
        parts: list[EventBatch] = []
        n = 0
        offsets: dict[tuple[str, int], int] = {}
        if self._pending and self.mode == "group":  # drop records of partitions a rebalance took away
            owned = self.consumer.assignment()
            self._pending = collections.deque(r for r in self._pending
                                              if TopicPartition(r.topic, r.partition) in owned)
        while n < max_events:
            if not self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and (parts or offsets):
                    break
                polled = self.consumer.poll(timeout_ms=max(0, int(remaining * 1000)) if not parts else 0,
                                            max_records=2000)
                if not polled:
                    if parts or offsets or remaining <= 0:
                        break
                    continue
                self._pending.extend(rec for records in polled.values() for rec in records)
            # take about as many records as the events still wanted (Arrow records hold many)
            take = max(1, int((max_events - n) / self._per_record))
            recs = [self._pending.popleft() for _ in range(min(take, len(self._pending)))]
            for rec in recs:
                offsets[(rec.topic, rec.partition)] = rec.offset + 1
                self.stats.bytes += len(rec.value or b"")
            self.stats.records += len(recs)
            b, errors = self.decoder.decode_many([rec.value for rec in recs])
            for i, reason in errors:
                self._dead_letter(recs[i], reason)
            self._per_record = max(1.0, (len(b) if b is not None else 0) / len(recs))
            if b is not None and len(b):
                parts.append(b)
                n += len(b)
        if not parts and not offsets:
            return None
        if len(parts) == 1:
            batch = parts[0]
        else:
            batch = EventBatch.concat(parts, self.schema.dense_dim, self.schema.fields)
        batch.source_offsets = offsets
        self.stats.events += len(batch)
        return batch

    def batches(self, max_events: int, timeout: float = 1.0, idle_exit_s: float = 0.0) -> Iterator[EventBatch]:
        """Yield batches forever, or until nothing arrived for ``idle_exit_s`` seconds (if > 0)."""
        last = time.monotonic()
        while True:
            b = self.poll_batch(max_events, timeout)
            if b is not None:
                last = time.monotonic()
                yield b
            elif idle_exit_s and time.monotonic() - last > idle_exit_s:
                return

    def _dead_letter(self, rec, reason: str) -> None:
        self.stats.dead_letters += 1
        key = reason.split(":")[0][:60]
        self.stats.dead_letter_reasons[key] = self.stats.dead_letter_reasons.get(key, 0) + 1
        log.warning("dead letter %s:%d@%d: %s", rec.topic, rec.partition, rec.offset, reason)
        if self._dlq is None:
            return
        source = f"{rec.topic}:{rec.partition}:{rec.offset}"
        headers = [
            (REASON_HEADER, reason.encode("utf-8")),
            (SOURCE_HEADER, source.encode()),
        ] + [(k, v) for k, v in (rec.headers or []) if k not in (REASON_HEADER, SOURCE_HEADER)]
        try:
            sent = self._dlq.send(self.dlq_topic, rec.value if rec.value is not None else b"", key=rec.key,
                                  headers=headers)
        except Exception as e:  # e.g. bigger than the producer's max_request_size: reported at the next flush
            sent = e
        self._dlq_sent.append((sent, source))

    # -- offsets ------------------------------------------------------------

    def flush_dead_letters(self) -> None:
        """Wait until the DLQ producer has sent every dead letter so far (flush: the broker answered each).

        A caller that records offsets durably on its own (a checkpoint) calls this before it does.
        Raises ``DeadLetterError`` when a dead letter was not acknowledged: the bad record then
        exists only in the source topic, so progress past it must not be recorded."""
        if self._dlq is None or not self._dlq_sent:
            return
        self._dlq.flush(60)
        sent, self._dlq_sent = self._dlq_sent, []
        failed = [(src, s if isinstance(s, Exception) else s.exception or "not acknowledged within 60 s")
                  for s, src in sent if isinstance(s, Exception) or not s.succeeded()]
        if failed:
            src, why = failed[0]
            raise DeadLetterError(f"dead-letter topic {self.dlq_topic!r} did not take {len(failed)} bad record(s), "
                                  f"the first {src}: {why}; not recording progress past them")

    def mark_durable(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit offsets whose effect is durable. Dead letters are flushed first."""
        self.flush_dead_letters()
        if not offsets:
            return
        commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        self.consumer.commit(commit)

    def committed(self) -> dict[tuple[str, int], int | None]:
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        return {(self.topic, p): self.consumer.committed(TopicPartition(self.topic, p)) for p in sorted(parts)}

    def seek(self, offsets: dict[tuple[str, int], int]) -> None:
        """Move the read position (after restoring a checkpoint that is newer than the commits)."""
        moved = set(offsets)
        self._pending = collections.deque(r for r in self._pending if (r.topic, r.partition) not in moved)
        for (t, p), o in offsets.items():
            tp = TopicPartition(t, p)
            if tp in self.consumer.assignment():
                self.consumer.seek(tp, o)

    def lag(self) -> int:
        """Records not yet handed out: up to the topic head, over assigned partitions."""
        assigned = list(self.consumer.assignment())
        if not assigned:
            return 0
        try:
            ends = self.consumer.end_offsets(assigned)
            behind = sum(max(0, ends[tp] - self.consumer.position(tp)) for tp in assigned)
            return int(behind + len(self._pending))  # polled but not yet handed out
        except Exception:  # lag is informational only
            return -1

    def close(self) -> None:
        if self._dlq is not None:
            self._dlq.flush(60)
            self._dlq.close()
        self.consumer.close(autocommit=False)


def read_topic(bootstrap: str, topic: str, timeout: float = 10.0, expected: int | None = None) -> list:
    """Read every record of a topic from the start without a group (for tests and tools)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    parts = c.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    ends = c.end_offsets(tps)
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = all(c.position(tp) >= ends[tp] for tp in tps)
        if done and (expected is None or len(out) >= expected):
            break
        for recs in c.poll(200).values():
            out.extend(recs)
        if expected is not None and len(out) < expected:
            ends = c.end_offsets(tps)
    c.close()
    return out


def sorted_by_offset(records: Sequence) -> list:
    return sorted(records, key=lambda r: (r.partition, r.offset))
