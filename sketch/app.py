"""The faust-streaming sketch worker: events in, versioned hot sets out.

* faust's consumer group decides which events partitions (and table partitions)
  this worker owns; the records are read by the counting task
  (``sketch/counting.py``): a batched aiokafka reader of exactly those
  partitions, ``sketch.batch_records`` records per call, each batch decoded at
  once (``Decoder.decode_many``) and counted with one sketch update. faust's own
  consumer keeps the events partitions paused (its per-message stream costs far
  more per record than counting does).
* State: a faust Table on RocksDB (``store="rocksdb://"``, rocksdict driver),
  key ``p<partition>`` -> that partition's sketch snapshot with the offset after
  the last record it includes, written every ``sketch.checkpoint_interval_s``
  for a partition that counted something (one partition per round, built off
  the event loop). The reader starts each partition at its snapshot's offset,
  so a worker killed with SIGKILL resumes exactly where its last snapshot ends
  -- nothing lost or counted twice.
* Commit-on-checkpoint (``sketch/commits.py``): after each partition snapshot,
  and after a partition is restored from one, the worker commits that
  snapshot's offset to its consumer group (``kafka.sketch_group``) through the
  Kafka protocol, as Flink and Kafka Streams do on each checkpoint. So
  ``kafka-consumer-groups``, Burrow, Kafka UI and lag alerts see the worker's
  real position. The group's lag is the records not yet in a snapshot: the
  ``streamrec_sketch_partition_lag_records`` metric plus what each partition
  counted since its last snapshot (about one ``sketch.checkpoint_interval_s``
  of traffic), and equal to the metric once the worker has caught up and
  snapshotted. The committed offsets are for monitoring: a restart resumes
  from the snapshots, never from the group, and overwrites the group's
  offsets with the snapshots' own. A failed commit is logged as one warning
  line (one per run of failures), its offsets are retried with the next
  snapshot, and the worker keeps counting.
* A timer merges the partition sketches, chooses the hot set (FAE policy) and
  publishes it to the compacted ``hot-set`` topic under one constant key every
  ``sketch.publish_interval_s``, or sooner when the set changed by more than
  ``sketch.change_fraction``. Versions continue from the last one on the topic.
* Several workers of one app split the partitions (faust's consumer group). The
  worker that owns partition 0 publishes the group's hot set: its own partitions
  live plus the newest snapshot of every other partition, read from the table's
  changelog (``sketch/peers.py``); the others publish nothing.
* A recreated events topic (deleted and created again: a new topic id) is
  noticed while the worker runs: the counting task reads the topic's id through
  a Metadata request every snapshot interval (at most ``TOPIC_CHECK_MAX_S``
  apart, ``sketch/topic_watch.py``), and a restart compares it with the id its
  snapshots carry. Either way ``kafka.on_offsets_lost`` decides, as in the
  trainer: ``fail`` stops the worker with one line naming each partition's
  expected and held offsets; ``earliest`` / ``latest`` count each partition
  afresh from the new log's start / end and log one warning.
* An error the operator fixes -- a full, read-only or unwritable state directory,
  out of file handles, a recreated topic under ``fail`` -- stops the worker as
  SIGTERM does and reaches the CLI as its one line (the traceback at DEBUG only);
  a restart once it is fixed resumes from the last complete partition snapshots.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import threading
import time
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from streamrec.foundation import StreamrecError, is_resource_error
from streamrec.ingest import OffsetsLostError, aiokafka_security, client_settings, faust_credentials, offsets_lost_message

from .commits import CheckpointCommits, group_committer
from .counting import BatchMarker, PartitionReader
from .follower import latest_hotset
from .peers import PeerSnapshots
from .state import SketchState
from .topic_watch import TopicWatch

log = logging.getLogger(__name__)

HOTSET_KEY = b"hot-set"
TABLE_NAME = "sketch-state"
INFLIGHT = "inflight.json"  # the batch being counted (sketch/counting.py BatchMarker), in the state dir
TOPIC_CHECK_MAX_S = 5.0  # the events topic's id is read again at least this often (and every snapshot interval)


def is_fatal_line(exc: BaseException) -> bool:
    """An error the operator fixes and the worker reports as one line, not a crash: a full, read-only or
    unwritable state directory, out of file handles (:func:`streamrec.foundation.is_resource_error`), or a
    streamrec error that says what to do (a recreated topic under ``kafka.on_offsets_lost=fail``)."""
    return is_resource_error(exc) or isinstance(exc, StreamrecError)


def faust_settings(cfg, bootstrap: str) -> dict:
    """faust App settings tuned for quick group joins (the embedded broker waits a full rebalance timeout);
    the cluster's security settings go in as ``broker_credentials``."""
    return dict(
        broker=f"kafka://{bootstrap}",
        broker_credentials=faust_credentials(client_settings(cfg.kafka)),
        store="rocksdb://",
        datadir=cfg.sketch.state_dir,
        web_enabled=False,
        topic_partitions=cfg.kafka.partitions,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        broker_rebalance_timeout=3.0,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        # a partition snapshot holds its count-min cells (megabytes); hot sets can be large too
        producer_max_request_size=32 << 20,
        consumer_max_fetch_size=64 << 20,
        stream_wait_empty=False,
    )


def changelog_topic(cfg) -> str:
    """faust's changelog topic of the sketch table (``<app id>-<table>-changelog``)."""
    return f"{cfg.kafka.sketch_group}-{TABLE_NAME}-changelog"


def check_state(cfg, bootstrap: str) -> tuple[int, str | None]:
    """Make the worker's state fit the events topic before faust starts; ``(partitions, topic id)``.

    faust refuses to start (PartitionsMismatch, at every restart) when the table's changelog
    topic has another partition count than the events topic, e.g. after a broker came back
    empty and auto-created one. The changelog and the local table then describe nothing that
    still exists: both are dropped (logged) and the counts rebuild from the stream. The
    table's partition count is the events topic's own, not the config's."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient

    from streamrec.ingest import topic_id

    security = client_settings(cfg.kafka)
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **security)
    try:
        events = c.partitions_for_topic(cfg.kafka.events_topic) or set()
        changelog = c.partitions_for_topic(changelog_topic(cfg)) or set()
        events_id = topic_id(c, cfg.kafka.events_topic)
    finally:
        c.close()
    n = len(events) or cfg.kafka.partitions
    if changelog and len(changelog) != n:
        log.warning("changelog %s has %d partitions, the events topic %s has %d: dropping it and the local state in "
                    "%s; counts rebuild from the stream", changelog_topic(cfg), len(changelog),
                    cfg.kafka.events_topic, n, cfg.sketch.state_dir)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **security)
        try:
            admin.delete_topics([changelog_topic(cfg)])
        finally:
            admin.close()
        shutil.rmtree(cfg.sketch.state_dir, ignore_errors=True)
    return n, (str(events_id) if events_id is not None else None)


def _quiet_persisted_offsets(store, closing: threading.Event) -> None:
    """Make faust's RocksDB store skip, not raise, a resource error when it records a changelog offset,
    and skip recording altogether once ``closing`` is set (the worker is closing the table's databases
    in another thread; a write racing that close would fail in RocksDB's binding).

    faust records the changelog offset of each table write in RocksDB from a producer callback, where an
    error is an asyncio callback failure of its own. On a full or read-only disk the same error fails the
    counting task's table write, which reports it as the worker's one line; the recorded offset only
    shortens a later recovery (without it, recovery replays more of the changelog), so skipping it loses
    nothing."""
    set_offset = getattr(store, "set_persisted_offset", None)
    if set_offset is None:
        return

    def set_persisted_offset(tp, offset: int) -> None:
        if closing.is_set():  # set on the event loop, where faust calls this: no write can start after it
            log.debug("changelog offset %s of %s not recorded: the state table is closing", offset, tp)
            return
        try:
            set_offset(tp, offset)
        except Exception as e:
            if not is_resource_error(e):
                raise
            log.debug("recording changelog offset %s of %s in the state table failed: %s", offset, tp, e)

    store.set_persisted_offset = set_persisted_offset


class _PartitionEvent:
    """Stands in for faust's current event while the counting task writes a partition's snapshot: faust
    sends a table write to the changelog partition (and local RocksDB partition) of the current event's."""

    def __init__(self, topic: str, partition: int):
        self.message = types.SimpleNamespace(topic=topic, partition=partition, timestamp=time.time())


def _keep_paused(consumer, topic: str) -> None:
    """Make faust's consumer never fetch ``topic`` (the counting task reads it): recovery resumes every
    assigned partition after each rebalance, so its ``resume_partitions`` leaves that topic's out."""
    if getattr(consumer, "_streamrec_keeps_paused", None) == topic:
        return
    resume = consumer.resume_partitions

    def resume_others(tps):
        return resume({tp for tp in tps if tp.topic != topic})

    consumer.resume_partitions = resume_others
    consumer._streamrec_keeps_paused = topic


def build_app(cfg, bootstrap: str, state: SketchState | None = None, partitions: int | None = None, metrics=None,
              on_fatal=None):
    """The faust App with its table, the batched counting task and the publisher timer; returns (app, state).
    ``metrics``: a :class:`~.metrics.SketchMetrics` told of the lag and of every published hot set.
    ``on_fatal``: called with the error that stops the counting task when that error is the operator's to fix
    (:func:`is_fatal_line`: a full or read-only disk, a recreated topic under ``kafka.on_offsets_lost=fail``);
    it is to stop the worker and report the error as one line (:func:`run_worker`). Without it, such an
    error crashes the app like any other."""
    import faust
    from faust.streams import _current_event

    state = state or SketchState(cfg)
    marker = BatchMarker(Path(cfg.sketch.state_dir) / INFLIGHT, cfg.kafka.events_topic, state.decoder.schema)
    app = faust.App(cfg.kafka.sketch_group, **faust_settings(cfg, bootstrap))
    events = app.topic(cfg.kafka.events_topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    hot_topic = app.topic(cfg.kafka.hotset_topic, key_type=bytes, value_type=bytes,
                          key_serializer="raw", value_serializer="raw")
    table = app.Table(TABLE_NAME, partitions=partitions or cfg.kafka.partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})
    closing = threading.Event()  # the table's databases are being closed (a resource error stops the worker)
    if on_fatal is not None:
        _quiet_persisted_offsets(table.data, closing)
    interval = cfg.sketch.checkpoint_interval_s
    ready: set[int] = set()  # events partitions this worker owns and has restored: the counting task reads these
    epoch: dict[int, int] = {}  # bumped at each restore/drop: a batch read before that is not counted
    dirty: set[int] = set()  # counted since their last snapshot
    last_ckpt: dict[int, float] = {}
    pool = ThreadPoolExecutor(1, thread_name_prefix="sketch-count")  # counting and snapshots, off the event loop
    commits = CheckpointCommits(cfg.kafka.events_topic, group_committer(app, cfg.kafka.events_topic))

    def snapshot(p: int) -> tuple[int, bytes]:
        """Partition ``p``'s snapshot and the offset it holds (the next record to count), taken together."""
        with state.lock:
            return state.next_offset[p], state.snapshot(p)

    def restore(p: int, why: str) -> None:
        blob = table.get(b"p%d" % p)
        log.info("partition %d: %s, snapshot %s", p, why, f"{len(blob)} bytes" if blob else "none")
        state.restore(p, blob)
        epoch[p] = epoch.get(p, 0) + 1
        last_ckpt[p] = time.monotonic()
        ready.add(p)

    async def checkpoint(p: int) -> None:
        """Write partition ``p``'s snapshot (its counts and the offset after them) into the table."""
        dirty.discard(p)
        last_ckpt[p] = time.monotonic()
        at = epoch.get(p)
        offset, blob = await asyncio.get_running_loop().run_in_executor(pool, snapshot, p)
        if p not in ready or epoch.get(p) != at:
            return  # revoked meanwhile: the new owner resumes from the previous snapshot
        ev = _PartitionEvent(cfg.kafka.events_topic, p)
        token = _current_event.set(weakref.ref(ev))
        try:
            table[b"p%d" % p] = blob
        finally:
            _current_event.reset(token)
        commits.offer(p, offset)  # commit-on-checkpoint: the group's offset follows the snapshot

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender, **kwargs):
        # the table is recovered by now: take every assigned partition's snapshot at once (a restarted worker
        # publishes the counts of all its partitions, also those with no new records), and keep faust's own
        # consumer off the events partitions (recovery resumes them right after this signal)
        _keep_paused(app.consumer, cfg.kafka.events_topic)
        mine = {tp for tp in app.consumer.assignment() if tp.topic == cfg.kafka.events_topic}
        app.consumer.pause_partitions(mine)
        for tp in mine:
            if not state.has(tp.partition):
                restore(tp.partition, "assigned")
                # the group's offset is where this worker resumes: also a partition that gets no new records
                commits.offer(tp.partition, state.next_offset[tp.partition])
        ready.intersection_update(tp.partition for tp in mine)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender, revoked, **kwargs):
        # another worker takes these over and resumes from their snapshots: drop our copies
        for tp in revoked:
            if tp.topic == cfg.kafka.events_topic:
                ready.discard(tp.partition)
                dirty.discard(tp.partition)
                epoch[tp.partition] = epoch.get(tp.partition, 0) + 1
                state.drop(tp.partition)
                commits.forget([tp.partition])

    @app.agent(events, name="sketch-group")
    async def membership(stream):
        # faust's stream of the events topic keeps this worker in the group that splits the partitions (and the
        # table's with them); the counting task reads the records. Its partitions stay paused: what faust fetched
        # before the pause took effect is left to the counting task (nothing is acked or committed here).
        async for _ in stream.noack().events():
            pass

    def count(p: int, recs: list) -> None:
        """Count one partition's batch (in the pool thread): the marker first, so a death here is known."""
        offsets = [r.offset for r in recs]
        values = [r.value for r in recs]
        skip = marker.begin(p, offsets, values)
        if skip:
            state.quarantine.update((p, o) for o in skip)
        state.apply_many(p, offsets, values)
        marker.clear()

    reader = PartitionReader(bootstrap, cfg.kafka.events_topic, cfg.sketch.batch_records, aiokafka_security(cfg.kafka))
    watch = TopicWatch(bootstrap, cfg.kafka.events_topic, client_settings(cfg.kafka))
    watch_every = max(1.0, min(interval, TOPIC_CHECK_MAX_S))
    n_partitions = partitions or cfg.kafka.partitions

    async def check_topic() -> None:
        """Apply ``kafka.on_offsets_lost`` when the events topic was deleted and recreated (a new topic id)
        to every partition this worker counts: ``fail`` raises :class:`OffsetsLostError` (one line naming
        each partition's expected and held offsets); ``earliest`` / ``latest`` start each partition's counts
        afresh at the new log's start / end and log one warning. A topic that is gone, not recreated yet,
        or whose metadata cannot be read now is checked again at the next round."""
        try:
            now = await asyncio.get_running_loop().run_in_executor(None, watch.read)
        except Exception as e:  # the broker is unreachable: the reader's own errors say so; checked again later
            log.debug("reading the metadata of %s failed: %s", cfg.kafka.events_topic, e)
            return
        if now.topic_id is None or now.topic_id == state.topic_id:
            return
        if state.topic_id is None:  # the first id seen (a broker that answered none at start)
            state.topic_id = now.topic_id
            return
        owned = sorted(p for p in ready if state.has(p))
        if not owned:
            return  # applied once partitions are assigned again (faust rebalances when a topic goes and comes)
        if now.partitions != n_partitions:
            raise StreamrecError(
                f"{cfg.kafka.events_topic} was deleted and recreated with {now.partitions} partitions (the "
                f"worker's state has {n_partitions}; id {state.topic_id} is now {now.topic_id}): restart the "
                f"worker, it rebuilds its state for the new topic")
        await start_over({p: state.next_offset[p] for p in owned}, state.topic_id, now.topic_id,
                         "the topic was deleted and recreated")

    async def start_over(expected: dict[int, int], old: str, new: str, what: str) -> None:
        """Apply ``kafka.on_offsets_lost`` to partitions whose resume offsets (``expected``) are of the topic
        with id ``old``, now ``new``: the trainer's policy and message (``offsets_lost_message``)."""
        topic, owned = cfg.kafka.events_topic, sorted(expected)
        why = f"{what}: id {old} is now {new}"
        begin, end = await reader.log_bounds(owned)
        msgs = [offsets_lost_message(topic, p, expected[p], begin.get(p), end.get(p), why) for p in owned]
        policy = cfg.kafka.on_offsets_lost
        if policy == "fail":
            raise OffsetsLostError("; ".join(msgs))
        start = {p: (begin if policy == "earliest" else end).get(p, 0) for p in owned}
        state.start_over(new, start)
        for p in owned:
            epoch[p] = epoch.get(p, 0) + 1  # the reader is positioned again; a batch read before is not counted
            dirty.add(p)  # the next snapshot carries the new topic's id and offset
            last_ckpt[p] = 0.0
        log.warning("%s -> counting afresh from %s (kafka.on_offsets_lost=%s)", "; ".join(msgs),
                    ", ".join(f"{topic}[{p}]@{o}" for p, o in sorted(start.items())), policy)

    def close_store() -> None:
        """Close the table's RocksDB databases (in a thread, before the worker stops): on a full or read-only
        disk closing one takes seconds (RocksDB flushes its memtable and retries), which faust's own stop would
        spend on the event loop, stalling its consumer thread's keepalive. Nothing is written to the table
        after the counting task stopped; faust drops the closed databases at its stop."""
        for p, db in list(getattr(table.data, "_dbs", {}).items()):  # faust's RocksDB store: partition -> Rdict
            try:
                db.close()
            except Exception as e:  # the disk's error again: the snapshots before it are what a restart reads
                log.debug("closing the state table's partition %s: %s", p, e)

    @app.task
    async def count_batches():
        loop = asyncio.get_running_loop()
        await reader.start()
        positioned: dict[int, int] = {}  # partition -> the epoch the reader was positioned in
        checked = time.monotonic()
        try:
            while True:  # until the app stops (the task is cancelled)
                if time.monotonic() - checked >= watch_every:  # before a snapshot records offsets of a new topic
                    checked = time.monotonic()
                    await check_topic()
                restored = {p: v for p, v in list(state.recreated.items()) if p in ready}
                if restored:  # snapshots of a deleted topic (restored at start or at a rebalance)
                    old = sorted({v[0] for v in restored.values()})
                    await start_over({p: v[1] for p, v in restored.items()}, ", ".join(old), state.topic_id,
                                     "the snapshot was taken before the topic was deleted and recreated")
                owned = set(ready)
                reseek = {p for p in owned if positioned.get(p) != epoch.get(p)}
                await reader.follow({p: state.next_offset[p] for p in owned if state.has(p)}, reseek)
                positioned = {p: epoch.get(p) for p in owned}
                if not owned:
                    await asyncio.sleep(0.2)
                    continue
                got = await reader.read(timeout_ms=200)
                for p, recs in got.items():
                    if p in ready and positioned.get(p) == epoch.get(p):
                        await loop.run_in_executor(pool, count, p, recs)
                        dirty.add(p)
                now = time.monotonic()
                due = [p for p in dirty if now - last_ckpt.get(p, 0.0) >= interval]
                if due:  # one partition per round: snapshots spread out instead of all at once
                    await checkpoint(min(due, key=lambda p: last_ckpt.get(p, 0.0)))
        except Exception as e:  # a bad record never gets here (apply_many contains it): the disk, the broker, a bug
            if on_fatal is not None and is_fatal_line(e):
                log.debug("the counting task stops", exc_info=True)  # the traceback for a developer only
                pub["stopped"] = True  # counts past the last snapshot are not published (a restart recounts them)
                closing.set()
                await loop.run_in_executor(None, close_store)
                on_fatal(naming_path(e, cfg.sketch.state_dir))
                return
            log.exception("the counting task failed: the worker stops (a restart resumes from the snapshots)")
            raise  # faust crashes the app on a task's exception: never a worker that silently stopped counting
        finally:
            await commits.close()
            await reader.stop()
            await asyncio.get_running_loop().run_in_executor(None, watch.close)

    pub = {"version": None, "last": None, "at": 0.0, "events": -1}
    tick = max(0.5, min(1.0, cfg.sketch.publish_interval_s / 4))
    peers_box: dict[str, PeerSnapshots] = {}

    @app.timer(interval=tick, name="sketch-publish")
    async def publish():
        if pub.get("stopped"):
            return
        if metrics is not None:
            metrics.observe_lag(reader, cfg.kafka.events_topic)  # the counting task's reader fetches the events
        owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == cfg.kafka.events_topic}
        peers = None
        if len(owned) < n_partitions:  # several workers split the stream: one publishes the group's set
            if 0 not in owned:
                pub["version"] = None  # if partition 0 comes here later, continue from the topic's version
                return
            if "view" not in peers_box:
                peers_box["view"] = PeerSnapshots(bootstrap, changelog_topic(cfg), security=client_settings(cfg.kafka))
            peers = peers_box["view"].snapshots(exclude=owned)
            missing = set(range(n_partitions)) - owned - set(peers)
            pub.setdefault("split_at", time.monotonic())
            if missing and time.monotonic() - pub["split_at"] < 3 * cfg.sketch.publish_interval_s:
                return  # give the other workers' first snapshots a moment (a partition may have none: then go on)
        else:
            pub.pop("split_at", None)
        if pub["version"] is None:
            prev = latest_hotset(bootstrap, cfg.kafka.hotset_topic, timeout=5.0, security=client_settings(cfg.kafka))
            pub["version"] = prev.version if prev else 0
            pub["last"] = prev  # a restarted worker does not republish the set the topic already holds
        now = time.monotonic()
        due = now - pub["at"] >= cfg.sketch.publish_interval_s
        if not due and state.stats.events == pub["events"] and peers is None:
            return
        # off the event loop: choosing scans every candidate and the agent must keep counting meanwhile
        hs = await asyncio.get_running_loop().run_in_executor(None, state.choose, pub["version"] + 1, peers)
        if hs is None:
            return
        changed = hs.changed_fraction(pub["last"])
        version = hs.publish_as(pub["last"], due, cfg.sketch.change_fraction, state.stats.events != pub["events"])
        if version is None:
            if due:  # unchanged: looked at again at the next interval, not at every tick
                pub.update(at=now)
            return
        hs.version = version
        await hot_topic.send(key=HOTSET_KEY, value=hs.to_bytes())
        pub.update(version=hs.version, last=hs, at=now, events=state.stats.events)
        if metrics is not None:
            metrics.published(hs)
        log.info("published hot set v%d: %d rows, coverage %.3f, hit rate %.3f, %d events counted "
                 "(%d malformed records skipped, changed %.2f; %s)", hs.version, hs.rows, hs.coverage,
                 hs.hit_rate, hs.events, state.stats.bad_records, changed,
                 "this worker's partitions only" if peers is None else
                 f"partitions {sorted(owned)} live + {len(peers)} from other workers' snapshots")

    return app, state


def run_worker(cfg, bootstrap: str, loglevel: str = "warning") -> int:
    """Run the worker until SIGINT/SIGTERM (faust's Worker installs the signal handlers).

    An error the operator must fix (:func:`is_fatal_line`: a full or read-only state directory, a recreated
    topic under ``kafka.on_offsets_lost=fail``) stops the worker as SIGTERM does and is raised here once faust
    has shut down, so the CLI prints it as its one line; its traceback is logged at DEBUG only. Nothing is
    lost: a restart resumes from the last complete partition snapshots."""
    from faust.worker import Worker

    check_writable(cfg.sketch.state_dir)
    partitions, topic_id = check_state(cfg, bootstrap)
    state = SketchState(cfg, topic_id=topic_id, on_offsets_lost=cfg.kafka.on_offsets_lost)
    metrics = None
    if cfg.sketch.metrics_port:
        from .metrics import SketchMetrics

        metrics = SketchMetrics(state, cfg.sketch.metrics_port, cfg.sketch.metrics_host).start()
    fatal: list[BaseException] = []

    def stop(e: BaseException) -> None:
        if not fatal:
            fatal.append(e)
            os.kill(os.getpid(), signal.SIGTERM)  # faust's own graceful stop (its SIGTERM handler)

    app, _ = build_app(cfg, bootstrap, state, partitions, metrics=metrics, on_fatal=stop)
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        if metrics is not None:
            metrics.close()
    if fatal:
        raise fatal[0]
    return code


def check_writable(state_dir: str) -> None:
    """Write, sync and remove a small file in the state directory: a full or read-only one fails here with
    its OSError (ENOSPC, EROFS, EACCES, naming the path) before faust opens its RocksDB there."""
    d = Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    probe = d / f".write-probe-{os.getpid()}"
    try:
        f = open(probe, "wb")
        try:
            with f:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        finally:
            probe.unlink(missing_ok=True)
    except OSError as e:
        raise naming_path(e, state_dir) from e


def naming_path(e: BaseException, path: str) -> BaseException:
    """``e``, or for an OSError that names no file (a failed write or close says only its errno) the same
    error naming ``path``, so its one line says where the disk is full."""
    if isinstance(e, OSError) and e.errno and not e.filename:
        named = OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
        named.__cause__ = e
        return named
    return e
