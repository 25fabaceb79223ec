"""Kafka producer and consumer wrappers for events, with the dead-letter path.

The consumer yields decoded columnar batches plus the offsets they came from and
commits offsets only when the caller says a batch is durable. A record that
fails to decode or validate is written to the dead-letter topic with the reason
and its original bytes, counted, and skipped; the DLQ producer is flushed before
any offset past it is committed, so nothing is dropped silently.

The consumer also survives what a live cluster does to it:

- **Slow callers.** It polls the client on every call, pausing its partitions
  while it still holds unread records (back-pressure), so a slow trainer stays in
  its group; if it was dropped anyway it rejoins, and every partition assigned to
  it resumes where this consumer last handed records out (never at an older
  commit, never past a record not handed out). A commit that fails during a
  rebalance is retried at the next one, not fatal.
- **Lost offsets.** A position the log no longer holds (the broker answers out of
  range) or a topic that was deleted and recreated (its topic id changed) is never
  skipped silently: ``on_offsets_lost`` says what to do, and the default ``fail``
  stops with a message saying what was expected, what was found, and how to go on.

The consumer's parts live in their own modules: polls, the buffer and positions
(``partition_reader.py``), the dead-letter writer (``dead_letters.py``), the
crash-loop breaker's quarantine (``step_quarantine.py``) and the topic checks
(``topic_guard.py``); this module re-exports their public names.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Iterator, Sequence, get_args

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata

from streamrec.foundation import EventBatch, EventSchema, StreamrecError

from . import fast_records
from .codec import CODEC_HEADER, Decoder, encode_messages
from .consumer_stats import ConsumerStats
from .dead_letters import (  # noqa: F401  (re-exported: the dead-letter contract's names)
    ORIGINAL_SHA256_HEADER, ORIGINAL_SIZE_HEADER, REASON_HEADER, SOURCE_HEADER, DeadLetterError, DeadLetterWriter,
)
from .fast_records import RecordRun
from .inflight import DECODE, TRAIN
from .ingest_types import ConsumerMode, OffsetsLostPolicy
from .kafka_clients import client_settings
from .partition_reader import PartitionReader
from .step_quarantine import STEP_CRASH_REASON, CrashLoopBreaker  # noqa: F401  (STEP_CRASH_REASON re-exported)
from .topic_guard import (  # noqa: F401  (re-exported: the lost-offsets contract's names)
    OFFSETS_LOST_POLICIES, OffsetsLostError, TopicGuard, offsets_lost_message, topic_id,
)

if TYPE_CHECKING:
    from streamrec.ingest.ingest_config import IngestConfig, KafkaConfig

log = logging.getLogger(__name__)


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
    """Writes events of ``schema`` to the events topic that ``kafka`` names, in its wire form (``kafka.codec``,
    unless ``codec`` says otherwise)."""

    def __init__(self, bootstrap: str, kafka: KafkaConfig, schema: EventSchema, codec: str | None = None,
                 producer: KafkaProducer | None = None):
        self.schema = schema
        self.codec = codec or kafka.codec
        self.topic = kafka.events_topic
        self.events_per_message = kafka.events_per_message  # events per Arrow message
        self.producer = producer or make_producer(bootstrap, **client_settings(kafka))
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
        msgs = encode_messages(batch, self.schema, self.codec, self.events_per_message)
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


class EventConsumer:
    """Consumes the events topic as decoded mini-batches.

    ``kafka`` names the topics and the cluster (and the consumer's ``[kafka]`` settings), ``ingest``
    bounds the dead letters, and ``schema`` is what a valid event is.
    ``mode="group"`` joins the consumer group (partitions shared among trainers);
    ``mode="assign"`` takes every partition and still commits under the group id
    (one consumer, no group join: a quick start on brokers with slow joins);
    ``partitions`` narrows that to a fixed subset (a rank of a trainer group reads
    the partitions the static assignment gives it: the group never moves them).

    This class decodes what it reads and commits what the caller says is durable; its parts do the rest:
    ``reader`` (polls, the buffer and the positions, :class:`~.partition_reader.PartitionReader`),
    ``guard`` (the topic's identity, partitions and lost offsets, :class:`~.topic_guard.TopicGuard`),
    ``dead_letters`` (:class:`~.dead_letters.DeadLetterWriter`) and ``breaker`` (the crash-loop breaker,
    :class:`~.step_quarantine.CrashLoopBreaker`).
    """

    def __init__(
        self,
        bootstrap: str,
        kafka: KafkaConfig,
        ingest: IngestConfig,
        schema: EventSchema,
        group_id: str,
        mode: ConsumerMode = "group",
        dlq: bool = True,
        topic: str | None = None,
        on_offsets_lost: OffsetsLostPolicy | None = None,
        max_pending: int = 20_000,
        inflight_path: str | os.PathLike | None = None,
        partitions: Sequence[int] | None = None,
        **consumer_opts,
    ):
        if mode not in get_args(ConsumerMode):
            raise ValueError(f"mode must be one of {', '.join(get_args(ConsumerMode))}, got {mode!r}")
        self.topic = topic or kafka.events_topic
        self.dlq_topic = kafka.dlq_topic
        self.schema = schema
        self.decoder = Decoder(self.schema)
        self.stats = ConsumerStats()
        self.mode = mode
        self.on_offsets_lost = on_offsets_lost or kafka.on_offsets_lost
        if self.on_offsets_lost not in OFFSETS_LOST_POLICIES:
            raise ValueError(f"on_offsets_lost must be one of {', '.join(OFFSETS_LOST_POLICIES)}, "
                             f"got {self.on_offsets_lost!r}")
        self.max_pending = max_pending  # unread records held before partitions are paused
        # its producer is attached once the consumer exists (a consumer that cannot be built leaves none open)
        self.dead_letters = DeadLetterWriter(None, self.dlq_topic, ingest.dlq_max_bytes, self.stats)
        self.breaker = CrashLoopBreaker(inflight_path, self.schema, self.topic, self.stats, self.dead_letters)
        self.last_lag: dict[int, int] = {}  # partition -> records not handed out, as of the last ``lag()``
        opts = dict(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            # never reset a position silently: out of range raises, and the guard applies the policy
            auto_offset_reset="none",
            max_poll_records=2000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=2_000,
            # also the group's rebalance timeout: brokers wait up to this long for members
            max_poll_interval_ms=kafka.max_poll_interval_ms,
            client_id=f"streamrec-{group_id}",
            **client_settings(kafka),
        )
        opts.update(consumer_opts)
        self.consumer = KafkaConsumer(**opts)
        # fetched record batches parsed in C, handed out as runs (ingest/fast_records.py); kafka-python's
        # parser on any doubt
        self.fast_records = kafka.fast_records and fast_records.install(self.consumer, runs=True)
        self.reader = PartitionReader(self.consumer, self.topic, self.stats, max_pending, self.fast_records,
                                      lambda lost, why: self.guard.apply_offsets_lost(lost, why))
        fixed = set(partitions) if mode == "assign" and partitions is not None else None
        self.guard = TopicGuard(self.consumer, self.topic, mode, self.on_offsets_lost, self.stats,
                                self.reader.positions, self.reader.forget, fixed)
        if mode == "group":
            self.reader.subscribe()
        else:
            self.reader.assign(partitions)
        self.guard.start()
        self.dead_letters.producer = make_producer(bootstrap, **client_settings(kafka)) if dlq else None
        # events per record seen last time: how many records make max_events (None until a record is decoded:
        # the first take is one record, so a poll never hands over a whole backlog of many-event records)
        self._per_record: float | None = None

    # -- what the parts hold, under the names callers read ----------------------------

    @property
    def topic_id(self):
        """The topic's id (uuid) when first seen: a new id means it was recreated."""
        return self.guard.topic_id

    @property
    def partitions_changed(self) -> tuple[int, int] | None:
        """(had, has) when the topic gained partitions a group rank's fixed share does not cover."""
        return self.guard.partitions_changed

    @property
    def step_probe(self):
        """The trainer's probe of a training step (see :class:`~.step_quarantine.CrashLoopBreaker`)."""
        return self.breaker.step_probe

    @step_probe.setter
    def step_probe(self, probe) -> None:
        self.breaker.step_probe = probe

    @property
    def _next(self) -> dict[tuple[str, int], int]:  # partition -> the offset after the last record handed out
        return self.reader.positions

    @property
    def _pending(self):  # polled records not handed out yet
        return self.reader.pending

    @property
    def _dlq(self):  # the dead-letter producer (None: dead letters are counted and logged only)
        return self.dead_letters.producer

    @_dlq.setter
    def _dlq(self, producer) -> None:
        self.dead_letters.producer = producer

    @property
    def _dlq_sent(self) -> list:  # dead letters sent since the last flush
        return self.dead_letters.sent

    # -- reading ------------------------------------------------------------

    def poll_batch(self, max_events: int, timeout: float = 1.0) -> EventBatch | None:
        """Return up to about ``max_events`` decoded events, or None if nothing arrived in ``timeout``.

        Records are pulled from the client in large polls and kept in a small local
        buffer between calls: each client poll costs a round trip to its network
        thread, which made many small polls several times slower than the fetch.
        """
        deadline = time.monotonic() + timeout
        parts: list[EventBatch] = []
        handed: list = []  # records decoded for this call (what the caller will be handling)
        n = 0
        offsets: dict[tuple[str, int], int] = {}
        newest_ms = 0  # the newest record timestamp: when the newest of these events entered Kafka
        reader, breaker, positions = self.reader, self.breaker, self.reader.positions
        self.guard.check()
        breaker.maybe_clear(positions)
        if reader.pending:  # still holding records: poll anyway (group liveness, rebalances), fetch nothing new
            reader.poll(0, pause=True)
        while n < max_events:
            if not reader.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and (parts or offsets):
                    break
                polled = reader.poll(max(0, int(remaining * 1000)) if not parts else 0, pause=False)
                if not polled:
                    if parts or offsets or remaining <= 0:
                        break
                    continue
                reader.pending.extend(run for runs in polled.values() for run in runs)
            # take about as many records as the events still wanted (Arrow records hold many)
            runs = reader.take(max(1, int((max_events - n) / self._per_record)) if self._per_record else 1)
            taken = 0
            for run in runs:  # a run: consecutive records of one partition in offset order (fast_records.RecordRun)
                key = (run.topic, run.partition)
                offsets[key] = positions[key] = run.last_offset + 1
                taken += len(run)
                newest_ms = max(newest_ms, run.newest_ms())
            self.stats.records += taken
            runs = breaker.quarantine(runs)
            if not runs:
                continue
            handed.extend(runs)
            breaker.mark(DECODE, runs)
            got = 0
            for run in _merge_runs(runs):  # each event is tagged with its partition (the trainer's merge)
                values = run.values()
                self.stats.bytes += sum(map(len, filter(None, values)))
                b, errors = self.decoder.decode_many(values)
                for i, reason in errors:
                    self.dead_letters.write(run.record(i), reason)
                if b is not None and len(b):
                    b.source_partitions = np.full(len(b), run.partition, np.int32)
                    b.source_records = _record_offsets(run, values, errors, len(b))
                    parts.append(b)
                    got += len(b)
            self._per_record = max(1.0, got / taken) if taken else self._per_record
            n += got
        breaker.mark(TRAIN, handed)  # the caller handles these now: a death is a "train" death
        if not parts and not offsets:
            return None
        if len(parts) == 1:
            batch = parts[0]
        else:
            batch = EventBatch.concat(parts, self.schema.dense_dim, self.schema.fields)
        batch.source_offsets = offsets
        batch.source_newest_ms = int(newest_ms)
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

    # -- positions ---------------------------------------------------------------------

    def partitions_behind(self) -> set[int]:
        """Partitions of the topic with records not handed out yet, as far as the last fetch's high
        watermark tells (no broker round trip): they will deliver, so waiting for them is worth it."""
        return self.reader.partitions_behind()

    def fetch_behind(self) -> bool:
        """Whether a fetch's high watermark shows records no fetch has brought yet (a slow fetch, not a
        quiet stream; :meth:`PartitionReader.fetch_behind`)."""
        return self.reader.fetch_behind()

    def wait_for_assignment(self, timeout_s: float, stop: threading.Event | None = None) -> list:
        """Poll (fetching nothing) until the group assigns this consumer partitions; [] when ``stop`` is set.
        Raises RuntimeError after ``timeout_s`` without an assignment."""
        return self.reader.wait_for_assignment(timeout_s, stop)

    def set_positions(self, offsets: dict[tuple[str, int], int]) -> None:
        """Resume these partitions at these offsets (a restored checkpoint's), now and after any rebalance."""
        self.reader.set_positions(offsets)

    def seek(self, offsets: dict[tuple[str, int], int]) -> None:
        """Move the read position (after restoring a checkpoint that is newer than the commits)."""
        self.reader.set_positions(offsets)

    def apply_offsets_lost(self, lost: dict, why: str, begin: dict | None = None,
                           end: dict | None = None) -> dict:
        """Apply ``on_offsets_lost`` to partitions whose position the log no longer holds (``lost``:
        TopicPartition -> the offset expected there). ``fail`` raises :class:`OffsetsLostError` naming
        them all; else each is moved to the log's start or end: ``{TopicPartition: offset}``."""
        return self.guard.apply_offsets_lost(lost, why, begin, end)

    def lag(self) -> int:
        """Records not yet handed out: up to the topic head, over assigned partitions (-1: the broker could
        not say). Each partition's share is kept in ``last_lag`` (partition -> records), for a metrics
        endpoint to read from its thread."""
        per = self.reader.lag()
        if per is None:
            return -1
        self.last_lag = per
        return int(sum(per.values()))

    # -- training steps (the crash-loop breaker) -----------------------------------------

    def suspect_step(self) -> tuple[list, int] | None:
        """``(ranges, deaths before)`` when the previous process died in a training step (the trainer
        quarantines the restored events among them, which Kafka will not deliver again), else None."""
        return self.breaker.suspect_step()

    def mark_step(self, partitions: np.ndarray, records: np.ndarray) -> None:
        """Before a training step: the marker names exactly its events' records (per event: partition and
        record offset, as ``EventBatch.source_partitions`` / ``source_records``; offset -1: not from Kafka,
        nothing to name), with the deaths already seen holding any of them."""
        self.breaker.mark_step(partitions, records)

    def step_done(self) -> None:
        """No training step runs now: a death from here on is not blamed on the last step's records."""
        self.breaker.step_done()

    def quarantine_events(self, batch: EventBatch, partitions: np.ndarray, records: np.ndarray, reason: str) -> None:
        """Dead-letter decoded events whose records crashed the trainer but will not be read again (restored
        from a checkpoint, their offsets committed): one JSON event per message, with the record's own source
        (``topic:partition:offset``) so the dead letter names the record it came from."""
        self.breaker.quarantine_events(batch, partitions, records, reason)

    # -- dead letters and offsets ------------------------------------------------------

    def dead_letter_events(self, batch: EventBatch, reason: str, source: str) -> None:
        """Dead-letter decoded events a later stage refused (e.g. a non-finite training step), one JSON
        event per message: they are no longer the bytes they arrived as, but nothing is dropped silently."""
        self.dead_letters.write_events(batch, reason, source)

    def flush_dead_letters(self) -> None:
        """Wait until the DLQ producer has sent every dead letter so far (flush: the broker answered each).

        A caller that records offsets durably on its own (a checkpoint) calls this before it does.
        Raises ``DeadLetterError`` when a dead letter was not acknowledged: the bad record then
        exists only in the source topic, so progress past it must not be recorded."""
        self.dead_letters.flush()

    def mark_durable(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit offsets whose effect is durable. Dead letters are flushed first."""
        self.flush_dead_letters()
        if not offsets:
            return
        commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        try:
            self.consumer.commit(commit)
        except kafka_errors.KafkaError as e:  # a rebalance, a moved coordinator: the next commit carries them
            self.stats.commit_failures += 1
            log.warning("offset commit failed (%s: %s); the checkpoint holds these offsets and the next commit "
                        "retries", type(e).__name__, e)

    def committed(self) -> dict[tuple[str, int], int | None]:
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        return {(self.topic, p): self.consumer.committed(TopicPartition(self.topic, p)) for p in sorted(parts)}

    def close(self) -> None:
        self.breaker.close()  # a clean stop: nothing was in flight
        self.dead_letters.close()
        self.consumer.close(autocommit=False)


def _record_offsets(run, values: list, errors: list, n: int) -> np.ndarray:
    """Per decoded event of ``run`` (``n`` events from ``values``, less the ``errors``): its record's offset.
    One event per record (JSON) is a gather; an Arrow record holds as many events as its rows."""
    offs = np.fromiter((r.offset for r in run), np.int64, count=len(run))
    if errors:
        good = np.ones(len(values), bool)
        good[[i for i, _ in errors]] = False
        offs = offs[good]
        values = [v for v, g in zip(values, good) if g]
    if len(offs) == n:
        return offs
    counts = np.fromiter((_events_in(v) for v in values), np.int64, count=len(values))
    if int(counts.sum()) != n:  # cannot happen for records the decoder took; never guess a record
        log.warning("%s[%d]: %d events from %d records do not match their row counts; their records are not "
                    "tracked", run.topic, run.partition, n, len(values))
        return np.full(n, -1, np.int64)
    return np.repeat(offs, counts)


def _events_in(value: bytes) -> int:
    """Events in one record that decoded: an Arrow IPC stream's rows, else one (a JSON event)."""
    if value[:4] == b"\xff\xff\xff\xff":
        import pyarrow as pa

        return int(pa.ipc.open_stream(value).read_all().num_rows)
    return 1


def _merge_runs(runs: list) -> list:
    """Consecutive runs of one partition joined into one (decoded together); the order is kept."""
    out: list = []
    for run in runs:
        if out and out[-1].partition == run.partition and out[-1].topic == run.topic:
            prev = out[-1]
            if prev.recs is run.recs and prev.hi == run.lo:
                out[-1] = RecordRun(prev.topic, prev.partition, prev.epochs, prev.recs, prev.kind, prev.lo, run.hi)
            elif prev.kind == run.kind:  # two fetches: their records and epochs, end to end
                n = prev.hi - prev.lo
                epochs = [(max(0, i - prev.lo), e) for i, e in prev.epochs if i < prev.hi]
                epochs += [(n + max(0, i - run.lo), e) for i, e in run.epochs if i < run.hi]
                out[-1] = RecordRun(prev.topic, prev.partition, epochs, prev.recs[prev.lo:prev.hi]
                                    + run.recs[run.lo:run.hi], run.kind)
            else:
                out[-1] = RecordRun.of_records(prev.records() + run.records())
        else:
            out.append(run)
    return out



def read_topic(bootstrap: str, topic: str, timeout: float = 10.0, expected: int | None = None,
               security: dict | None = None) -> list:
    """Read every record of a topic from the start without a group (for tests and tools); ``security``:
    :func:`~streamrec.ingest.kafka_clients.client_settings` of a secured cluster."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", **(security or {}))
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
