"""The sketch worker's state, independent of faust: one sketch per partition.

Each partition's snapshot carries the offset *after* the last record it
includes, so a restarted worker skips records it already counted (Kafka may
redeliver from an older commit) and never counts one twice. Malformed records
are counted and skipped here; writing them to the dead-letter topic is the
trainer consumer's job (doing it here too would duplicate them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from streamrec.foundation import EventError, EventSchema
from streamrec.foundation.budget import HotBudget
from streamrec.sketch.sketch_config import SketchConfig
from streamrec.ingest import Decoder

from .hotset import EventSample, HotSet, choose_hot_set
from .popularity import PopularitySketch

log = logging.getLogger(__name__)

# Event times outside [0, wall clock + this] are not counted: one such event would poison a
# partition's sketch for good (kept in its snapshots). A time far ahead (e.g. microseconds sent as
# milliseconds) moves the decay reference there, scaling every count to 0 and weighing every later
# event 0; int64's minimum overflows ``ts - t0`` to a weight of inf.
MAX_FUTURE_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class CountingSpec:
    """What a worker's sketches count and how its hot set is chosen: the values the application computes
    once from its config and hands the sketch."""

    sketch: SketchConfig  # the sketches' accuracy and decay, the event sample, the state directory
    schema: EventSchema  # the events the worker decodes; its fields are the sketches' fields, in order
    budget: HotBudget  # the device tier's budget (``hot_budget``): the hot set fills exactly this
    field_tables: Mapping[str, str]  # field -> the embedding table its ids live in (``model.field_tables``)
    events_topic: str  # the topic counted (named in what the worker logs)


@dataclass
class WorkerStats:
    records: int = 0  # records applied
    events: int = 0  # events counted
    bad_records: int = 0  # malformed records skipped
    skipped: int = 0  # records already in a snapshot (redelivered after a restart)
    bad_times: int = 0  # events not counted because their time is before 1970 or too far ahead (MAX_FUTURE_MS)
    quarantined: int = 0  # records skipped because a worker process died handling them
    offsets_reset: int = 0  # partitions started afresh by kafka.on_offsets_lost (the topic was recreated)


class SketchState:
    """Per-partition sketches of one worker. ``topic_id``: the events topic's id; a snapshot taken
    from a topic with another id (deleted and recreated) is not resumed: its offsets would skip
    the new topic's first events. Such a partition starts empty at offset 0 and, when
    ``on_offsets_lost`` is given (the worker's ``kafka.on_offsets_lost``), is listed in
    :attr:`recreated` for the worker to apply that policy before it counts the partition."""

    def __init__(self, spec: CountingSpec, topic_id: str | None = None, on_offsets_lost: str | None = None):
        self.spec = spec
        self.topic_id = topic_id
        self.on_offsets_lost = on_offsets_lost
        # partition -> (the snapshot's topic id, the offset it would have resumed at): restored from another topic
        self.recreated: dict[int, tuple[str, int]] = {}
        self.quarantine: set[tuple[int, int]] = set()  # (partition, offset) of records that killed a worker
        self.fields = list(spec.schema.fields)
        self.decoder = Decoder(spec.schema)
        self.sketches: dict[int, PopularitySketch] = {}
        self.next_offset: dict[int, int] = {}
        self.sample = EventSample(spec.sketch.sample_events, spec.sketch.sample_rate)
        self.stats = WorkerStats()
        # apply() runs on the event loop, choose() in a thread: the lock covers reads of shared state
        self.lock = threading.RLock()

    def new_sketch(self) -> PopularitySketch:
        s = self.spec.sketch
        return PopularitySketch(self.fields, s.epsilon, s.delta, s.half_life_s, s.top_k)

    # -- per record ------------------------------------------------------

    def has(self, partition: int) -> bool:
        return partition in self.sketches

    def restore(self, partition: int, blob: bytes | None) -> None:
        """Take a partition's snapshot (or start it empty when there is none)."""
        with self.lock:
            self._restore(partition, blob)

    def _restore(self, partition: int, blob: bytes | None) -> None:
        if blob:
            sk, meta = PopularitySketch.from_bytes_with_meta(blob)
            if self.topic_id and meta.get("topic_id") and meta["topic_id"] != self.topic_id:
                if self.on_offsets_lost:  # the worker applies its policy (and logs) before counting the partition
                    self.recreated[partition] = (str(meta["topic_id"]), int(meta.get("next_offset", 0)))
                else:
                    log.warning("partition %d: the snapshot was taken from another %s topic (id %s, now %s: "
                                "deleted and recreated); counting it afresh from offset 0", partition,
                                self.spec.events_topic, meta["topic_id"], self.topic_id)
                sk, meta = self.new_sketch(), {"next_offset": 0}
            if meta.get("stale_keys"):  # written before the sketch shared the store's table salt
                log.warning("partition %d: the snapshot's counts are keyed by an older streamrec; counting afresh "
                            "from offset %s (the hot set re-forms as events arrive)", partition, meta.get("next_offset"))
                sk = self.new_sketch()
            if sk.fields != self.fields:
                raise ValueError(f"snapshot of partition {partition} is over fields {sk.fields}, "
                                 f"the model has {self.fields}: clear {self.spec.sketch.state_dir}")
            self.sketches[partition] = sk
            self.next_offset[partition] = int(meta.get("next_offset", 0))
            if partition in self.recreated:
                log.info("partition %d: the snapshot is of the deleted topic (id %s); kafka.on_offsets_lost decides "
                         "where counting starts", partition, self.recreated[partition][0])
                return
            log.info("partition %d: resumed %d events from the snapshot (next offset %d)",
                     partition, sk.events, self.next_offset[partition])
        else:
            self.sketches[partition] = self.new_sketch()
            self.next_offset[partition] = 0

    def drop(self, partition: int) -> None:
        """Forget a partition this worker no longer owns."""
        with self.lock:
            self._drop(partition)

    def _drop(self, partition: int) -> None:
        self.sketches.pop(partition, None)
        self.next_offset.pop(partition, None)
        self.recreated.pop(partition, None)

    def start_over(self, topic_id: str | None, offsets: dict[int, int]) -> None:
        """The events topic was deleted and recreated (its id is now ``topic_id``): each partition in
        ``offsets`` counts afresh from that offset of the new topic, and the event sample is emptied, so
        the hot set is chosen from the new topic's events only. Snapshots taken from now on carry the new
        id; one of the old topic restored later is not resumed (:meth:`restore`)."""
        with self.lock:
            self.topic_id = topic_id
            for p, offset in offsets.items():
                self.sketches[p] = self.new_sketch()
                self.next_offset[p] = int(offset)
                self.recreated.pop(p, None)
            self.stats.offsets_reset += len(offsets)
            self.sample = EventSample(self.spec.sketch.sample_events, self.spec.sketch.sample_rate)

    def apply(self, partition: int, offset: int, value: bytes | None) -> bool:
        """Count one Kafka record; False when it was skipped (already counted, or malformed)."""
        with self.lock:
            return self._apply(partition, offset, value)

    def _apply(self, partition: int, offset: int, value: bytes | None) -> bool:
        if partition not in self.sketches:
            self.restore(partition, None)
        if offset < self.next_offset[partition]:
            self.stats.skipped += 1
            return False
        self.next_offset[partition] = offset + 1
        if (partition, offset) in self.quarantine:
            self.stats.quarantined += 1
            log.error("p%d@%d: skipping the record that killed the previous worker process (the trainer's "
                      "dead-letter path handles it)", partition, offset)
            return False
        try:
            batch = self.decoder.decode(value)
        except Exception as e:  # EventError only (the decoder contains the rest); anything else: skipped the same
            self.stats.bad_records += 1
            log.warning("skipping malformed record p%d@%d (the dead-letter path owns it): %s", partition, offset,
                        e if isinstance(e, EventError) else f"{type(e).__name__}: {e}")
            return False
        try:
            ts = np.asarray(batch.ts, dtype=np.int64)
            ok = (ts >= 0) & (ts <= int(time.time() * 1000) + MAX_FUTURE_MS)
            if not ok.all():
                self.stats.bad_times += int(len(ok) - ok.sum())
                log.warning("p%d@%d: %d of %d events have an event time out of range (e.g. %d ms) and are not "
                            "counted", partition, offset, len(ok) - ok.sum(), len(ok), int(ts[~ok][0]))
                if not ok.any():
                    self.stats.bad_records += 1
                    return False
                batch = batch.take(np.flatnonzero(ok))
            self.sketches[partition].update_batch(batch)
            self.sample.offer(batch)
        except Exception:  # a decoded record the sketch cannot count: a bug, but one record must not stop the worker
            self.stats.bad_records += 1
            log.exception("skipping record p%d@%d: counting it failed", partition, offset)
            return False
        self.stats.records += 1
        self.stats.events += len(batch)
        return True

    def apply_many(self, partition: int, offsets: list[int], values: list[bytes | None]) -> int:
        """Count a batch of one partition's Kafka records (ascending offsets) at once; returns the events
        counted. The worker's counting path: one decode of the whole batch (``Decoder.decode_many``) and
        one sketch update, instead of per-record calls. Records below the partition's next offset
        (already counted) and quarantined ones are skipped; malformed ones are logged and skipped one by
        one with their reasons. A partition this worker no longer holds is left alone (revoked while the
        batch was read). Unlike :meth:`apply`, a record whose events all have out-of-range times is
        counted in ``bad_times`` only (the batch decode does not say which record an event came from)."""
        with self.lock:
            if partition not in self.sketches or not offsets:
                return 0
            start = self.next_offset[partition]
            if offsets[0] < start:  # redelivered: the snapshot counted these already
                keep = [i for i, o in enumerate(offsets) if o >= start]
                self.stats.skipped += len(offsets) - len(keep)
                offsets, values = [offsets[i] for i in keep], [values[i] for i in keep]
                if not offsets:
                    return 0
            self.next_offset[partition] = offsets[-1] + 1
            if self.quarantine:
                held = [i for i, o in enumerate(offsets) if (partition, o) in self.quarantine]
                for i in held:
                    self.stats.quarantined += 1
                    log.error("p%d@%d: skipping the record that killed the previous worker process (the trainer's "
                              "dead-letter path handles it)", partition, offsets[i])
                if held:
                    gone = set(held)
                    offsets = [o for i, o in enumerate(offsets) if i not in gone]
                    values = [v for i, v in enumerate(values) if i not in gone]
            batch, errors = self.decoder.decode_many(values)
            for i, reason in errors:
                self.stats.bad_records += 1
                log.warning("skipping malformed record p%d@%d (the dead-letter path owns it): %s",
                            partition, offsets[i], reason)
            self.stats.records += len(values) - len(errors)
            if batch is None or not len(batch):
                return 0
            try:
                ts = batch.ts
                ok = (ts >= 0) & (ts <= int(time.time() * 1000) + MAX_FUTURE_MS)
                if not ok.all():
                    bad = int(len(ok) - ok.sum())
                    self.stats.bad_times += bad
                    log.warning("p%d@%d-%d: %d of %d events have an event time out of range (e.g. %d ms) and are "
                                "not counted", partition, offsets[0], offsets[-1], bad, len(ok), int(ts[~ok][0]))
                    if not ok.any():
                        return 0
                    batch = batch.take(np.flatnonzero(ok))
                self.sketches[partition].update_batch(batch)
                self.sample.offer(batch)
            except Exception:  # decoded events the sketch cannot count: a bug, but it must not stop the worker
                self.stats.bad_records += len(values) - len(errors)
                log.exception("skipping records p%d@%d-%d: counting them failed", partition, offsets[0], offsets[-1])
                return 0
            self.stats.events += len(batch)
            return len(batch)

    def snapshot(self, partition: int) -> bytes:
        with self.lock:
            meta = {"next_offset": self.next_offset[partition]}
            if self.topic_id:
                meta["topic_id"] = self.topic_id
            return self.sketches[partition].to_bytes(meta=meta)

    # -- the hot set -----------------------------------------------------

    def merged(self, peers: dict[int, bytes] | None = None) -> PopularitySketch | None:
        """This worker's partition sketches merged, with ``peers``: the newest snapshots of partitions
        other workers own (:class:`streamrec.sketch.peers.PeerSnapshots`), for the group's global counts."""
        parts = [s for s in self.sketches.values() if s.t0_ms is not None]
        for p, blob in sorted((peers or {}).items()):
            if p in self.sketches:
                continue  # ours is newer than any snapshot of it
            try:
                sk, meta = PopularitySketch.from_bytes_with_meta(blob)
            except Exception as e:  # a peer's snapshot we cannot read: its partition is left out, not fatal
                log.warning("partition %d: the other worker's snapshot cannot be read (%s); left out", p, e)
                continue
            if (self.topic_id and meta.get("topic_id") and meta["topic_id"] != self.topic_id) or meta.get("stale_keys") \
                    or sk.fields != self.fields or sk.t0_ms is None:
                continue  # of a recreated topic, an older key scheme, another model, or empty
            parts.append(sk)
        if not parts:
            return None
        out = parts[0].copy()
        for s in parts[1:]:
            out.merge(s)
        return out

    def choose(self, version: int, peers: dict[int, bytes] | None = None) -> HotSet | None:
        """The hot set the current counts give (None before any event); with ``peers`` (other workers'
        partition snapshots), the group's."""
        with self.lock:
            m = self.merged(peers)
            sample = self.sample.frozen()
        if m is None:
            return None
        tables, ids, counts = m.candidates()
        # the device tier's own budget (hot.budget_bytes spent at each table's row cost), so the set fills it
        # exactly; chosen per table, a shared table's fields' counts summed
        b = self.spec.budget
        c = choose_hot_set(self.fields, tables, ids, counts, budget_rows=b.rows, budget_bytes=b.bytes,
                           row_bytes=dict(b.row_bytes), sample=sample, field_tables=dict(self.spec.field_tables))
        hs = HotSet(version=version, tables=c.tables, coverage=c.coverage, hit_rate=c.hit_rate,
                    window_start_ms=int(m.first_ms or 0), window_end_ms=int(m.now_ms or 0),
                    created_ms=int(time.time() * 1000), threshold=c.threshold, events=m.events)
        return hs
