"""The sketch worker's counting task: its partitions' records into the sketches, snapshots into the table.

:class:`CountLoop` owns what the task keeps per partition (which ones are restored and read, their
epochs, which counted since their last snapshot) and runs apart from faust's own consumer: it reads
the partitions faust assigned (:meth:`CountLoop.assigned`) with a batched reader
(``sketch/counting.py``), counts each batch in a pool thread, writes one partition's snapshot per
round into the state table and commits its offset to the group (``sketch/commits.py``). A recreated
events topic is applied by ``kafka.on_offsets_lost``, as in the trainer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from streamrec.foundation import StreamrecError
from streamrec.ingest.ingest_config import KafkaConfig
from streamrec.sketch.sketch_config import SketchConfig
from streamrec.ingest import OffsetsLostError, offsets_lost_message
from streamrec.ingest.faust_worker import Cluster, at_partition

from .commits import CheckpointCommits, group_committer
from .counting import BatchMarker, PartitionReader
from .fatal import is_fatal_line, naming_path
from .state import SketchState
from .topic_watch import TopicWatch

log = logging.getLogger(__name__)

INFLIGHT = "inflight.json"  # the batch being counted (sketch/counting.py BatchMarker), in the state dir
TOPIC_CHECK_MAX_S = 5.0  # the events topic's id is read again at least this often (and every snapshot interval)


class CountLoop:
    """The counting task of one worker over ``table`` (the faust Table of partition snapshots).

    ``on_fatal``: called with the error that stops the task when that error is the operator's to fix
    (:func:`~.fatal.is_fatal_line`); without it, such an error crashes the app like any other."""

    def __init__(self, app, table, state: SketchState, kafka: KafkaConfig, sketch: SketchConfig, cluster: Cluster,
                 partitions: int, on_fatal: Callable[[BaseException], None] | None = None):
        self.table = table
        self.state = state
        self.topic = kafka.events_topic
        self.on_offsets_lost = kafka.on_offsets_lost
        self.state_dir = sketch.state_dir
        self.interval = sketch.checkpoint_interval_s
        self.partitions = partitions
        self.on_fatal = on_fatal
        self.stopped = False  # a fatal error stopped counting: counts past the last snapshot are not published
        self.closing = threading.Event()  # the table's databases are being closed (a resource error stops the worker)
        self.ready: set[int] = set()  # events partitions this worker owns and has restored: the ones read
        self.epoch: dict[int, int] = {}  # bumped at each restore/drop: a batch read before that is not counted
        self.dirty: set[int] = set()  # counted since their last snapshot
        self.last_ckpt: dict[int, float] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sketch-count")  # counting and snapshots, off the loop
        self.commits = CheckpointCommits(self.topic, group_committer(app, self.topic))
        self.marker = BatchMarker(Path(sketch.state_dir) / INFLIGHT, self.topic, state.decoder.schema)
        self.reader = PartitionReader(cluster.bootstrap, self.topic, sketch.batch_records, cluster.aiokafka)
        self.watch = TopicWatch(cluster.bootstrap, self.topic, cluster.security)
        self.watch_every = max(1.0, min(self.interval, TOPIC_CHECK_MAX_S))

    # -- ownership (faust's rebalances) ------------------------------------

    async def assigned(self, mine: set[int]) -> None:
        """Take every assigned partition's snapshot at once (a restarted worker publishes the counts of all
        its partitions, also those with no new records); the table is recovered by now."""
        for p in mine:
            if not self.state.has(p):
                self.restore(p, "assigned")
                # the group's offset is where this worker resumes: also a partition that gets no new records
                self.commits.offer(p, self.state.next_offset[p])
        self.ready.intersection_update(mine)

    async def revoked(self, lost: set[int]) -> None:
        """Another worker takes these over and resumes from their snapshots: drop our copies."""
        for p in lost:
            self.ready.discard(p)
            self.dirty.discard(p)
            self.epoch[p] = self.epoch.get(p, 0) + 1
            self.state.drop(p)
            self.commits.forget([p])

    def restore(self, p: int, why: str) -> None:
        blob = self.table.get(b"p%d" % p)
        log.info("partition %d: %s, snapshot %s", p, why, f"{len(blob)} bytes" if blob else "none")
        self.state.restore(p, blob)
        self.epoch[p] = self.epoch.get(p, 0) + 1
        self.last_ckpt[p] = time.monotonic()
        self.ready.add(p)

    # -- snapshots ----------------------------------------------------------

    def snapshot(self, p: int) -> tuple[int, bytes]:
        """Partition ``p``'s snapshot and the offset it holds (the next record to count), taken together."""
        with self.state.lock:
            return self.state.next_offset[p], self.state.snapshot(p)

    async def checkpoint(self, p: int) -> None:
        """Write partition ``p``'s snapshot (its counts and the offset after them) into the table."""
        self.dirty.discard(p)
        self.last_ckpt[p] = time.monotonic()
        at = self.epoch.get(p)
        offset, blob = await asyncio.get_running_loop().run_in_executor(self.pool, self.snapshot, p)
        if p not in self.ready or self.epoch.get(p) != at:
            return  # revoked meanwhile: the new owner resumes from the previous snapshot
        with at_partition(self.topic, p):  # faust writes to the current event's changelog partition
            self.table[b"p%d" % p] = blob
        self.commits.offer(p, offset)  # commit-on-checkpoint: the group's offset follows the snapshot

    def close_store(self) -> None:
        """Close the table's RocksDB databases (in a thread, before the worker stops): on a full or read-only
        disk closing one takes seconds (RocksDB flushes its memtable and retries), which faust's own stop would
        spend on the event loop, stalling its consumer thread's keepalive. Nothing is written to the table
        after the counting task stopped; faust drops the closed databases at its stop."""
        for p, db in list(getattr(self.table.data, "_dbs", {}).items()):  # faust's RocksDB store: partition -> Rdict
            try:
                db.close()
            except Exception as e:  # the disk's error again: the snapshots before it are what a restart reads
                log.debug("closing the state table's partition %s: %s", p, e)

    # -- counting -----------------------------------------------------------

    def count(self, p: int, recs: list) -> None:
        """Count one partition's batch (in the pool thread): the marker first, so a death here is known."""
        offsets = [r.offset for r in recs]
        values = [r.value for r in recs]
        skip = self.marker.begin(p, offsets, values)
        if skip:
            self.state.quarantine.update((p, o) for o in skip)
        self.state.apply_many(p, offsets, values)
        self.marker.clear()

    async def run(self) -> None:
        """Count until the app stops (faust cancels the task); a fatal line stops it through ``on_fatal``."""
        loop = asyncio.get_running_loop()
        await self.reader.start()
        positioned: dict[int, int] = {}  # partition -> the epoch the reader was positioned in
        checked = time.monotonic()
        try:
            while True:
                if time.monotonic() - checked >= self.watch_every:  # before a snapshot records a new topic's offsets
                    checked = time.monotonic()
                    await self.check_topic()
                positioned = await self.count_round(loop, positioned)
        except Exception as e:  # a bad record never gets here (apply_many contains it): the disk, the broker, a bug
            if self.on_fatal is not None and is_fatal_line(e):
                await self.stop_on(e)
                return
            log.exception("the counting task failed: the worker stops (a restart resumes from the snapshots)")
            raise  # faust crashes the app on a task's exception: never a worker that silently stopped counting
        finally:
            await self.commits.close()
            await self.reader.stop()
            await asyncio.get_running_loop().run_in_executor(None, self.watch.close)

    async def count_round(self, loop, positioned: dict[int, int]) -> dict[int, int]:
        """One round: apply a recreated topic's snapshots, follow the owned partitions, count what one read
        brings, snapshot at most one due partition. Returns the epochs the reader is positioned in."""
        restored = {p: v for p, v in list(self.state.recreated.items()) if p in self.ready}
        if restored:  # snapshots of a deleted topic (restored at start or at a rebalance)
            old = sorted({v[0] for v in restored.values()})
            await self.start_over({p: v[1] for p, v in restored.items()}, ", ".join(old), self.state.topic_id,
                                  "the snapshot was taken before the topic was deleted and recreated")
        owned = set(self.ready)
        reseek = {p for p in owned if positioned.get(p) != self.epoch.get(p)}
        await self.reader.follow({p: self.state.next_offset[p] for p in owned if self.state.has(p)}, reseek)
        positioned = {p: self.epoch.get(p) for p in owned}
        if not owned:
            await asyncio.sleep(0.2)
            return positioned
        got = await self.reader.read(timeout_ms=200)
        for p, recs in got.items():
            if p in self.ready and positioned.get(p) == self.epoch.get(p):
                await loop.run_in_executor(self.pool, self.count, p, recs)
                self.dirty.add(p)
        now = time.monotonic()
        due = [p for p in self.dirty if now - self.last_ckpt.get(p, 0.0) >= self.interval]
        if due:  # one partition per round: snapshots spread out instead of all at once
            await self.checkpoint(min(due, key=lambda p: self.last_ckpt.get(p, 0.0)))
        return positioned

    async def stop_on(self, e: BaseException) -> None:
        """Stop for an error the operator fixes: nothing more is published or written, the table's databases
        close off the event loop, and ``on_fatal`` gets the error (naming the state directory)."""
        log.debug("the counting task stops", exc_info=True)  # the traceback for a developer only
        self.stopped = True  # counts past the last snapshot are not published (a restart recounts them)
        self.closing.set()
        await asyncio.get_running_loop().run_in_executor(None, self.close_store)
        self.on_fatal(naming_path(e, self.state_dir))

    # -- a recreated events topic ---------------------------------------------

    async def check_topic(self) -> None:
        """Apply ``kafka.on_offsets_lost`` when the events topic was deleted and recreated (a new topic id)
        to every partition this worker counts: ``fail`` raises :class:`OffsetsLostError` (one line naming
        each partition's expected and held offsets); ``earliest`` / ``latest`` start each partition's counts
        afresh at the new log's start / end and log one warning. A topic that is gone, not recreated yet,
        or whose metadata cannot be read now is checked again at the next round."""
        state = self.state
        try:
            now = await asyncio.get_running_loop().run_in_executor(None, self.watch.read)
        except Exception as e:  # the broker is unreachable: the reader's own errors say so; checked again later
            log.debug("reading the metadata of %s failed: %s", self.topic, e)
            return
        if now.topic_id is None or now.topic_id == state.topic_id:
            return
        if state.topic_id is None:  # the first id seen (a broker that answered none at start)
            state.topic_id = now.topic_id
            return
        owned = sorted(p for p in self.ready if state.has(p))
        if not owned:
            return  # applied once partitions are assigned again (faust rebalances when a topic goes and comes)
        if now.partitions != self.partitions:
            raise StreamrecError(
                f"{self.topic} was deleted and recreated with {now.partitions} partitions (the "
                f"worker's state has {self.partitions}; id {state.topic_id} is now {now.topic_id}): restart the "
                f"worker, it rebuilds its state for the new topic")
        await self.start_over({p: state.next_offset[p] for p in owned}, state.topic_id, now.topic_id,
                              "the topic was deleted and recreated")

    async def start_over(self, expected: dict[int, int], old: str, new: str, what: str) -> None:
        """Apply ``kafka.on_offsets_lost`` to partitions whose resume offsets (``expected``) are of the topic
        with id ``old``, now ``new``: the trainer's policy and message (``offsets_lost_message``)."""
        topic, owned = self.topic, sorted(expected)
        why = f"{what}: id {old} is now {new}"
        begin, end = await self.reader.log_bounds(owned)
        msgs = [offsets_lost_message(topic, p, expected[p], begin.get(p), end.get(p), why) for p in owned]
        policy = self.on_offsets_lost
        if policy == "fail":
            raise OffsetsLostError("; ".join(msgs))
        start = {p: (begin if policy == "earliest" else end).get(p, 0) for p in owned}
        self.state.start_over(new, start)
        for p in owned:
            self.epoch[p] = self.epoch.get(p, 0) + 1  # the reader is positioned again: a batch read before is not
            # counted
            self.dirty.add(p)  # the next snapshot carries the new topic's id and offset
            self.last_ckpt[p] = 0.0
        log.warning("%s -> counting afresh from %s (kafka.on_offsets_lost=%s)", "; ".join(msgs),
                    ", ".join(f"{topic}[{p}]@{o}" for p, o in sorted(start.items())), policy)
