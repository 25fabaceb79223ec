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
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence, get_args

import numpy as np
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata

from streamrec.foundation import EventBatch, EventSchema, StreamrecError

from . import fast_records
from .codec import CODEC_HEADER, Decoder, encode_messages
from .fast_records import RecordRun
from .ingest_types import ConsumerMode, OffsetsLostPolicy
from .inflight import DECODE, STEP, TRAIN, InflightMarker, exact_runs, holds_any, probe_decode, ranges_of
from .kafka_clients import client_settings

log = logging.getLogger(__name__)

REASON_HEADER = "streamrec-error"
SOURCE_HEADER = "streamrec-source"
# a bad record bigger than ingest.dlq_max_bytes is dead-lettered truncated, with these two headers
ORIGINAL_SIZE_HEADER = "streamrec-original-bytes"
ORIGINAL_SHA256_HEADER = "streamrec-original-sha256"
_OWN_HEADERS = (REASON_HEADER, SOURCE_HEADER, ORIGINAL_SIZE_HEADER, ORIGINAL_SHA256_HEADER)
_MAX_REASON = 2000  # characters of the reason kept in its header


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
        self.producer = producer or make_producer(bootstrap, **client_settings(cfg))
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


class OffsetsLostError(StreamrecError, RuntimeError):
    """The log no longer holds the position to resume from (``kafka.on_offsets_lost = fail``)."""


OFFSETS_LOST_POLICIES = get_args(OffsetsLostPolicy)  # kafka.on_offsets_lost


def topic_id(consumer: KafkaConsumer, topic: str):
    """The topic's id (uuid) in the client's metadata cache, or None (not seen yet, or a client or broker
    without topic ids). A topic deleted and recreated under the same name gets a new id."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)  # kafka-python's metadata cache
    try:
        return cluster.topic_id(topic) if cluster is not None else None
    except Exception:  # an older client without topic ids: the out-of-range check still holds
        return None


def _describe(ranges) -> str:
    return ", ".join(f"{r.topic}[{r.partition}]@{r.first}" + (f"..{r.last}" if r.last != r.first else "")
                     for r in ranges)


def offsets_lost_message(topic: str, partition: int, expected: int | None, begin: int | None, end: int | None,
                         why: str) -> str:
    """One line for the operator: what was expected, what was found, how to go on."""
    held = f"[{begin}, {end})" if begin is not None else "unknown"
    return (f"{topic}[{partition}]: expected to resume at offset {expected}, the log now holds offsets {held} "
            f"({why}); events between may be lost. To go on, set kafka.on_offsets_lost=earliest (re-read the "
            f"partition from its start) or =latest (skip to its end), e.g. --set kafka.on_offsets_lost=earliest")


@dataclass
class ConsumerStats:
    records: int = 0
    events: int = 0
    bytes: int = 0
    dead_letters: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0  # records dead-lettered because a process died handling them (crash-loop breaker)
    commit_failures: int = 0  # commits refused (rebalance, coordinator moved); retried at the next one
    rebalances: int = 0  # partition assignments after the first
    offsets_reset: int = 0  # partitions moved by kafka.on_offsets_lost (earliest/latest)
    partitions_added: int = 0  # partitions the topic gained while this consumer ran (assign mode reads them too)


class _Rebalance(ConsumerRebalanceListener):
    """Notes what a rebalance changed; the consumer acts on it after the poll, on its own thread
    (kafka-python calls listeners on its network thread, where blocking calls are not allowed)."""

    def __init__(self, owner: "EventConsumer"):
        self.owner = owner

    def on_partitions_revoked(self, revoked):
        self.owner._revoked.update(revoked)

    def on_partitions_assigned(self, assigned):
        self.owner._assigned.update(assigned)


class EventConsumer:
    """Consumes the events topic as decoded mini-batches.

    ``mode="group"`` joins the consumer group (partitions shared among trainers);
    ``mode="assign"`` takes every partition and still commits under the group id
    (one consumer, no group join: a quick start on brokers with slow joins);
    ``partitions`` narrows that to a fixed subset (a rank of a trainer group reads
    the partitions the static assignment gives it: the group never moves them).
    """

    def __init__(
        self,
        bootstrap: str,
        cfg,
        group_id: str,
        mode: ConsumerMode = "group",
        schema: EventSchema | None = None,
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
        self.cfg = cfg
        self.topic = topic or cfg.kafka.events_topic
        self.dlq_topic = cfg.kafka.dlq_topic
        self.schema = schema or EventSchema.from_config(cfg)
        self.decoder = Decoder(self.schema)
        self.stats = ConsumerStats()
        self.mode = mode
        self.on_offsets_lost = on_offsets_lost or cfg.kafka.on_offsets_lost
        if self.on_offsets_lost not in OFFSETS_LOST_POLICIES:
            raise ValueError(f"on_offsets_lost must be one of {', '.join(OFFSETS_LOST_POLICIES)}, "
                             f"got {self.on_offsets_lost!r}")
        self.max_pending = max_pending  # unread records held before partitions are paused
        self._pending: collections.deque = collections.deque()  # polled, not yet decoded
        self._revoked: set = set()  # noted by the rebalance listener, handled after the poll
        self._assigned: set = set()
        # the crash-loop breaker (ingest/inflight.py): what a dead predecessor was handling
        self._marker = InflightMarker(inflight_path) if inflight_path else None
        self._suspect = self._marker.found if self._marker is not None else None
        # a training step's records (kept after _suspect is cleared: a step holding them again counts deaths)
        self._step_suspect = self._suspect if self._suspect is not None and self._suspect[0] == STEP else None
        # the trainer's probe of a training step (``STEP`` suspects, first death): record values -> the indices
        # of those that kill a process training them alone; None: no probe, the first death only counts
        self.step_probe = None
        if self._suspect is not None:
            phase, ranges, deaths = self._suspect
            doing = {DECODE: "decoding", STEP: "running a training step on"}.get(phase, "training on")
            log.error("the previous consumer process died while %s records %s (deaths so far: %d); they are %s",
                      doing, _describe(ranges), deaths + 1,
                      "quarantined to the DLQ" if deaths >= 1 else
                      "probed in a child process" if phase in (DECODE, STEP) else
                      "retried once, quarantined if it dies again")
        self._next: dict[tuple[str, int], int] = {}  # the offset after the last record handed out (or sought)
        self._assigned_once = False
        self._fixed: set[int] | None = None  # mode "assign" with explicit partitions: a group rank's static share
        self._known_partitions: set[int] = set()
        self.partitions_changed: tuple[int, int] | None = None  # (had, has) when a fixed share no longer fits
        self.topic_id = None  # the topic's id (uuid) when first seen: a new id means it was recreated
        opts = dict(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            # never reset a position silently: out of range raises, and _offsets_lost applies the policy
            auto_offset_reset="none",
            max_poll_records=2000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=2_000,
            # also the group's rebalance timeout: brokers wait up to this long for members
            max_poll_interval_ms=cfg.kafka.max_poll_interval_ms,
            client_id=f"streamrec-{group_id}",
            **client_settings(cfg),
        )
        opts.update(consumer_opts)
        self.consumer = KafkaConsumer(**opts)
        # fetched record batches parsed in C, handed out as runs (ingest/fast_records.py); kafka-python's
        # parser on any doubt
        self.fast_records = (bool(getattr(cfg.kafka, "fast_records", True))
                             and fast_records.install(self.consumer, runs=True))
        if mode == "group":
            self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        else:
            parts = None
            deadline = time.monotonic() + 30
            while not parts:
                parts = self.consumer.partitions_for_topic(self.topic)
                if not parts:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"topic {self.topic!r} does not exist")
                    time.sleep(0.2)
            self._fixed = set(partitions) if partitions is not None else None
            if partitions is not None:
                missing = sorted(set(partitions) - set(parts))
                if missing:
                    raise StreamrecError(f"topic {self.topic!r} has partitions {sorted(parts)}; partitions "
                                         f"{missing} asked for do not exist")
                parts = set(partitions)
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            self.consumer.assign(tps)
            self._on_assigned(tps)
        self.topic_id = self._current_topic_id()
        self._known_partitions = set(self.consumer.partitions_for_topic(self.topic) or ())
        self._dlq = make_producer(bootstrap, **client_settings(cfg)) if dlq else None
        self._dlq_sent: list = []  # (send future or the error send raised, "topic:partition:offset") since the last flush
        self._per_record = 1.0  # events per record seen last time: how many records make max_events
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
        handed: list = []  # records decoded for this call (what the caller will be handling)
        n = 0
        offsets: dict[tuple[str, int], int] = {}
        newest_ms = 0  # the newest record timestamp: when the newest of these events entered Kafka
        self._check_topic()
        self._maybe_clear_suspect()
        if self._pending:  # still holding records: poll anyway (group liveness, rebalances), fetch nothing new
            self._poll(0, pause=True)
        while n < max_events:
            if not self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and (parts or offsets):
                    break
                polled = self._poll(max(0, int(remaining * 1000)) if not parts else 0, pause=False)
                if not polled:
                    if parts or offsets or remaining <= 0:
                        break
                    continue
                self._pending.extend(run for runs in polled.values() for run in runs)
            # take about as many records as the events still wanted (Arrow records hold many)
            runs = self._take_runs(max(1, int((max_events - n) / self._per_record)))
            taken = 0
            for run in runs:  # a run: consecutive records of one partition in offset order (fast_records.RecordRun)
                key = (run.topic, run.partition)
                offsets[key] = self._next[key] = run.last_offset + 1
                taken += len(run)
                newest_ms = max(newest_ms, run.newest_ms())
            self.stats.records += taken
            if self._suspect is not None:
                runs = self._quarantine_suspects(runs)
                if not runs:
                    continue
            handed.extend(runs)
            if self._marker is not None:
                self._marker.mark(DECODE, ranges_of(runs), self._deaths_of(runs, DECODE))
            got = 0
            for run in _merge_runs(runs):  # each event is tagged with its partition (the trainer's merge)
                values = run.values()
                self.stats.bytes += sum(map(len, filter(None, values)))
                b, errors = self.decoder.decode_many(values)
                for i, reason in errors:
                    self._dead_letter(run.record(i), reason)
                if b is not None and len(b):
                    b.source_partitions = np.full(len(b), run.partition, np.int32)
                    b.source_records = _record_offsets(run, values, errors, len(b))
                    parts.append(b)
                    got += len(b)
            self._per_record = max(1.0, got / taken)
            n += got
        if self._marker is not None and handed:  # the caller handles these now: a death is a "train" death
            self._marker.mark(TRAIN, ranges_of(handed), self._deaths_of(handed, TRAIN))
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

    def partitions_behind(self) -> set[int]:
        """Partitions of the topic with records not handed out yet, as far as the last fetch's high
        watermark tells (no broker round trip): they will deliver, so waiting for them is worth it."""
        out = set()
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if tp.topic == self.topic and hw is not None and self._next.get((tp.topic, tp.partition), hw) < hw:
                out.add(tp.partition)
        return out

    # -- the crash-loop breaker ----------------------------------------------------

    def _take_runs(self, k: int) -> list:
        """Up to ``k`` records from the front of what was polled, as runs (the last one split if needed)."""
        out = []
        pending = self._pending
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

    def _quarantine_suspects(self, runs: list) -> list:
        """Dead-letter the records a dead predecessor could not get past; return the others (as runs).
        Rare (after a crash), so record by record."""
        if not any(x.topic == r.topic and x.partition == r.partition and x.first <= r.last_offset
                   and r.offset <= x.last for r in runs for x in self._suspect[1]):
            return runs
        kept = self._quarantine_records([rec for r in runs for rec in r.records()])
        return [RecordRun.of_records(list(g)) for _, g in itertools.groupby(kept, lambda r: (r.topic, r.partition))]

    def _quarantine_records(self, recs: list) -> list:
        phase, ranges, deaths = self._suspect
        suspects = [r for r in recs if any(x.holds(r.topic, r.partition, r.offset) for x in ranges)]
        if not suspects:
            return recs
        if phase == DECODE and deaths == 0:
            culprits = {id(suspects[i]) for i in probe_decode(self.schema, [r.value or b"" for r in suspects])}
            why = "crashed the consumer: the process died decoding this record, and so did a probe"
        elif phase == STEP and deaths == 0:
            if self.step_probe is None:
                return recs
            culprits = {id(suspects[i]) for i in self.step_probe([r.value or b"" for r in suspects])}
            why = STEP_CRASH_REASON
        elif deaths >= 1:  # died twice with these in flight (a crash the probe could not reproduce, or training)
            culprits = {id(r) for r in suspects}
            what = "in training steps" if phase == STEP else "training batches"
            why = (f"crashed the {'trainer' if phase == STEP else 'consumer'}: {deaths + 1} processes died {what} "
                   f"holding this record (quarantined with the {len(suspects)} records in flight with it)")
        else:
            return recs  # first death in training: retried once (kept in the marker as a suspect)
        for r in suspects:
            if id(r) in culprits:
                self.stats.quarantined += 1
                self._dead_letter(r, why)
        return [r for r in recs if id(r) not in culprits]

    def _maybe_clear_suspect(self) -> None:
        """Back to normal once every suspect record was handled (probed, quarantined or retried)."""
        if self._suspect is not None and all(self._next.get((x.topic, x.partition), -1) > x.last
                                             for x in self._suspect[1]):
            self._suspect = None

    def _deaths_of(self, runs: list, phase: str) -> int:
        """Deaths already seen with any of these records (runs) in flight in ``phase`` (0 when none is a suspect)."""
        if self._suspect is None or self._suspect[0] != phase:
            return 0
        _, ranges, deaths = self._suspect
        if not any(x.holds(run.topic, run.partition, r.offset) for run in runs for r in run for x in ranges):
            return 0
        return deaths + 1

    def suspect_step(self) -> tuple[list, int] | None:
        """``(ranges, deaths before)`` when the previous process died in a training step (the trainer
        quarantines the restored events among them, which Kafka will not deliver again), else None."""
        s = self._step_suspect
        return (list(s[1]), s[2]) if s is not None else None

    def mark_step(self, partitions: np.ndarray, records: np.ndarray) -> None:
        """Before a training step: the marker names exactly its events' records (per event: partition and
        record offset, as ``EventBatch.source_partitions`` / ``source_records``; offset -1: not from Kafka,
        nothing to name), with the deaths already seen holding any of them."""
        if self._marker is None:
            return
        p, o = np.asarray(partitions), np.asarray(records)
        known = o >= 0
        if not known.all():
            p, o = p[known], o[known]
        deaths = 0
        s = self._step_suspect
        if s is not None and holds_any(s[1], self.topic, p, o).any():
            deaths = s[2] + 1
        self._marker.mark_runs(STEP, self.topic, exact_runs(p, o), deaths)

    def step_done(self) -> None:
        """No training step runs now: a death from here on is not blamed on the last step's records."""
        if self._marker is not None:
            self._marker.idle()

    def quarantine_events(self, batch: EventBatch, partitions: np.ndarray, records: np.ndarray, reason: str) -> None:
        """Dead-letter decoded events whose records crashed the trainer but will not be read again (restored
        from a checkpoint, their offsets committed): one JSON event per message, with the record's own source
        (``topic:partition:offset``) so the dead letter names the record it came from."""
        from types import SimpleNamespace

        from .codec import encode_json

        seen = set()
        for ev, p, o in zip(batch.to_events(), np.asarray(partitions).tolist(), np.asarray(records).tolist()):
            if (p, o) not in seen:
                seen.add((p, o))
                self.stats.quarantined += 1
            self._dead_letter(SimpleNamespace(topic=self.topic, partition=p, offset=o, key=None, headers=None,
                                              value=encode_json(ev)), reason)

    # -- the client, rebalances and lost offsets ---------------------------------

    def _poll(self, timeout_ms: int, pause: bool) -> dict:
        """One client poll. ``pause``: hold every partition (we still have unread records) so the
        poll keeps the group membership without fetching more; else resume them and fetch."""
        kc = self.consumer
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
            self._offsets_lost(lost, "the broker says the offset is out of range")
            return {}
        except kafka_errors.NoOffsetForPartitionError:  # assigned, never committed: position it ourselves
            self._assigned.update(kc.assignment())
            polled = {}
        if self._revoked or self._assigned:
            revoked, self._revoked = self._revoked, set()
            assigned, self._assigned = self._assigned, set()
            self._forget(revoked)
            if assigned:
                self._on_assigned(sorted(assigned, key=lambda tp: (tp.topic, tp.partition)))
            # records fetched from positions we just replaced (the group's older commit) are not ours
            polled = {tp: recs for tp, recs in polled.items() if tp not in assigned and tp not in revoked}
        if not self.fast_records:  # kafka-python's ConsumerRecord lists: one run each
            polled = {tp: [RecordRun.of_records(recs)] for tp, recs in polled.items() if recs}
        if pause:  # fetched before the pause took effect: keep them, in order, after what we hold
            self._pending.extend(run for runs in polled.values() for run in runs)
            return {}
        if sum(map(len, self._pending)) > self.max_pending and owned:
            kc.pause(*owned)
        return polled

    def _forget(self, partitions) -> None:
        """Drop unread records of partitions this consumer no longer owns (or will re-seek)."""
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if gone and self._pending:
            self._pending = collections.deque(r for r in self._pending if (r.topic, r.partition) not in gone)

    def _on_assigned(self, partitions) -> None:
        """Position newly assigned partitions: where this consumer left off, else the committed offset,
        else the start of the log."""
        kc = self.consumer
        tps = [tp for tp in partitions if tp.topic == self.topic]
        if self._assigned_once:
            self.stats.rebalances += 1
        self._assigned_once = True
        self._forget(tps)
        begin = None
        for tp in tps:
            key = (tp.topic, tp.partition)
            off = self._next.get(key)
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
            self._next[key] = int(off)

    def wait_for_assignment(self, timeout_s: float, stop: threading.Event | None = None) -> list:
        """Poll (fetching nothing) until the group assigns this consumer partitions; [] when ``stop`` is set.
        Raises RuntimeError after ``timeout_s`` without an assignment."""
        deadline = time.monotonic() + timeout_s
        while not self.consumer.assignment():
            if stop is not None and stop.is_set():
                return []
            if time.monotonic() > deadline:
                raise RuntimeError(f"no partitions of {self.topic!r} assigned within {timeout_s:.0f} s")
            self._poll(200, pause=True)
        return sorted(self.consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))

    def set_positions(self, offsets: dict[tuple[str, int], int]) -> None:
        """Resume these partitions at these offsets (a restored checkpoint's), now and after any rebalance."""
        self._forget([TopicPartition(t, p) for t, p in offsets])
        owned = self.consumer.assignment()
        for (t, p), o in offsets.items():
            self._next[(t, p)] = int(o)
            tp = TopicPartition(t, p)
            if tp in owned:
                self.consumer.seek(tp, int(o))

    def _current_topic_id(self):
        return topic_id(self.consumer, self.topic)

    def _check_topic(self) -> None:
        """A topic deleted and recreated gets a new id: every position in it is meaningless now. A topic that
        gained partitions (added, or auto-created anew with the broker's default count) has records nobody
        reads unless they are assigned: in assign mode they are taken too (from their start)."""
        self._check_partitions()
        now = self._current_topic_id()
        if now is None:
            return
        if self.topic_id is None:
            self.topic_id = now
            return
        if now != self.topic_id:
            old, self.topic_id = self.topic_id, now
            owned = [tp for tp in self.consumer.assignment() if tp.topic == self.topic]
            self._offsets_lost({tp: self._next.get((tp.topic, tp.partition)) for tp in owned},
                               f"the topic was deleted and recreated: id {old} is now {now}")

    def _check_partitions(self) -> None:
        if self.mode != "assign":
            return  # the consumer group assigns new partitions itself
        parts = set(self.consumer.partitions_for_topic(self.topic) or ())  # the client's metadata cache
        added = parts - self._known_partitions
        if not parts or not added:
            return
        had = len(self._known_partitions)
        self._known_partitions = parts
        if self._fixed is not None:  # a group rank's static share: the group must re-plan (it restarts)
            self.partitions_changed = (had, len(parts))
            log.warning("topic %s now has %d partitions (had %d): this rank's static share no longer covers them",
                        self.topic, len(parts), had)
            return
        tps = [TopicPartition(self.topic, p) for p in sorted(added)]
        self.consumer.assign(sorted(self.consumer.assignment() | set(tps), key=lambda tp: (tp.topic, tp.partition)))
        self.consumer.seek_to_beginning(*tps)
        for tp in tps:
            self._next[(tp.topic, tp.partition)] = int(self.consumer.position(tp))
        self.stats.partitions_added += len(tps)
        log.warning("topic %s gained partitions %s (now %d): reading them from their start", self.topic,
                    sorted(added), len(parts))

    def _offsets_lost(self, lost: dict, why: str) -> None:
        self.apply_offsets_lost(lost, why)

    def apply_offsets_lost(self, lost: dict, why: str, begin: dict | None = None,
                           end: dict | None = None) -> dict:
        """Apply ``on_offsets_lost`` to partitions whose position the log no longer holds (``lost``:
        TopicPartition -> the offset expected there). ``fail`` raises :class:`OffsetsLostError` naming
        them all; else each is moved to the log's start or end: ``{TopicPartition: offset}``."""
        kc = self.consumer
        tps = [tp for tp in lost if isinstance(tp, TopicPartition)]
        if not tps:
            return {}
        if begin is None or end is None:
            try:
                begin, end = kc.beginning_offsets(tps), kc.end_offsets(tps)
            except kafka_errors.KafkaError:
                begin, end = {}, {}
        msgs = [offsets_lost_message(tp.topic, tp.partition, lost[tp], begin.get(tp), end.get(tp), why) for tp in tps]
        if self.on_offsets_lost == "fail":
            raise OffsetsLostError("; ".join(msgs))
        self._forget(tps)
        moved = {}
        for tp, msg in zip(tps, msgs):
            if self.on_offsets_lost == "earliest":
                kc.seek_to_beginning(tp)
            else:
                kc.seek_to_end(tp)
            moved[tp] = self._next[(tp.topic, tp.partition)] = int(kc.position(tp))
            self.stats.offsets_reset += 1
            log.warning("%s -> resuming at offset %d (kafka.on_offsets_lost=%s)", msg, moved[tp],
                        self.on_offsets_lost)
        return moved

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
        value = rec.value if rec.value is not None else b""
        headers = [
            # backslashreplace: a reason quoting a lone surrogate must not fail the dead letter itself
            (REASON_HEADER, reason[:_MAX_REASON].encode("utf-8", "backslashreplace")),
            (SOURCE_HEADER, source.encode()),
        ]
        limit = self.cfg.ingest.dlq_max_bytes
        if len(value) > limit:  # the DLQ topic would refuse it: keep a prefix, and say what the whole was
            headers += [(ORIGINAL_SIZE_HEADER, str(len(value)).encode()),
                        (ORIGINAL_SHA256_HEADER, hashlib.sha256(value).hexdigest().encode())]
            value = value[:limit]
        headers += [(k, v) for k, v in (rec.headers or []) if k not in _OWN_HEADERS]
        try:
            sent = self._dlq.send(self.dlq_topic, value, key=rec.key, headers=headers)
        except Exception as e:  # e.g. bigger than the producer's max_request_size: reported at the next flush
            sent = e
        self._dlq_sent.append((sent, source))

    def dead_letter_events(self, batch: EventBatch, reason: str, source: str) -> None:
        """Dead-letter decoded events a later stage refused (e.g. a non-finite training step), one JSON
        event per message: they are no longer the bytes they arrived as, but nothing is dropped silently."""
        from types import SimpleNamespace

        from .codec import encode_json

        for ev in batch.to_events():
            rec = SimpleNamespace(topic=source, partition=-1, offset=-1, key=None, headers=None,
                                  value=encode_json(ev))
            self._dead_letter(rec, reason)

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
        try:
            self.consumer.commit(commit)
        except kafka_errors.KafkaError as e:  # a rebalance, a moved coordinator: the next commit carries them
            self.stats.commit_failures += 1
            log.warning("offset commit failed (%s: %s); the checkpoint holds these offsets and the next commit "
                        "retries", type(e).__name__, e)

    def committed(self) -> dict[tuple[str, int], int | None]:
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        return {(self.topic, p): self.consumer.committed(TopicPartition(self.topic, p)) for p in sorted(parts)}

    def seek(self, offsets: dict[tuple[str, int], int]) -> None:
        """Move the read position (after restoring a checkpoint that is newer than the commits)."""
        self.set_positions(offsets)

    def lag(self) -> int:
        """Records not yet handed out: up to the topic head, over assigned partitions. Each partition's
        share is kept in ``last_lag`` (partition -> records), for a metrics endpoint to read from its thread."""
        assigned = list(self.consumer.assignment())
        if not assigned:
            self.last_lag = {}
            return 0
        try:
            ends = self.consumer.end_offsets(assigned)
            held = collections.Counter()  # polled but not yet handed out
            for run in list(self._pending):
                held[run.partition] += len(run)
            # the last fetch's high watermark too: tansu answers ListOffsets with less than the log end
            per = {tp.partition: max(0, max(ends[tp], self.consumer.highwater(tp) or 0) - self.consumer.position(tp))
                   + held.get(tp.partition, 0) for tp in assigned}
        except Exception:  # lag is informational only
            return -1
        self.last_lag = per
        return int(sum(per.values()))

    def close(self) -> None:
        if self._marker is not None:
            self._marker.clear()  # a clean stop: nothing was in flight
        if self._dlq is not None:
            self._dlq.flush(60)
            self._dlq.close()
        self.consumer.close(autocommit=False)


STEP_CRASH_REASON = ("crashed the trainer: the process died in a training step holding this record, and so did "
                     "a probe training it alone")


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
