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

import logging
import os
import shutil
import signal
import threading
from pathlib import Path

from streamrec.foundation import is_resource_error
from streamrec.ingest.ingest_config import KafkaConfig
from streamrec.sketch.sketch_config import SketchConfig
from streamrec.ingest.faust_worker import (
    Cluster, add_membership, raw_topic, run_app, watch_rebalances, worker_settings,
)

from .count_loop import INFLIGHT, TOPIC_CHECK_MAX_S, CountLoop
from .fatal import is_fatal_line, naming_path
from .publisher import HOTSET_KEY, HotSetPublisher
from .state import CountingSpec, SketchState

log = logging.getLogger(__name__)

__all__ = ["HOTSET_KEY", "INFLIGHT", "TABLE_NAME", "TOPIC_CHECK_MAX_S", "build_app", "changelog_topic", "check_state",
           "check_writable", "faust_settings", "is_fatal_line", "naming_path", "run_worker"]

TABLE_NAME = "sketch-state"


def faust_settings(cluster: Cluster, state_dir: str, partitions: int) -> dict:
    """faust App settings of the sketch worker (:func:`~streamrec.ingest.faust_worker.worker_settings`), its
    table under ``state_dir``."""
    # a partition snapshot holds its count-min cells (megabytes); hot sets can be large too
    return worker_settings(cluster, state_dir, partitions, consumer_max_fetch_size=64 << 20)


def changelog_topic(group: str) -> str:
    """faust's changelog topic of the sketch table of the app ``group`` (``kafka.sketch_group``)."""
    return f"{group}-{TABLE_NAME}-changelog"


def check_state(kafka: KafkaConfig, state_dir: str, cluster: Cluster) -> tuple[int, str | None]:
    """Make the worker's state fit the events topic before faust starts; ``(partitions, topic id)``.

    faust refuses to start (PartitionsMismatch, at every restart) when the table's changelog
    topic has another partition count than the events topic, e.g. after a broker came back
    empty and auto-created one. The changelog and the local table then describe nothing that
    still exists: both are dropped (logged) and the counts rebuild from the stream. The
    table's partition count is the events topic's own, not the config's."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient

    from streamrec.ingest import topic_id

    changelog_name = changelog_topic(kafka.sketch_group)
    c = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=None, enable_auto_commit=False,
                      **cluster.security)
    try:
        events = c.partitions_for_topic(kafka.events_topic) or set()
        changelog = c.partitions_for_topic(changelog_name) or set()
        events_id = topic_id(c, kafka.events_topic)
    finally:
        c.close()
    n = len(events) or kafka.partitions
    if changelog and len(changelog) != n:
        log.warning("changelog %s has %d partitions, the events topic %s has %d: dropping it and the local state in "
                    "%s; counts rebuild from the stream", changelog_name, len(changelog),
                    kafka.events_topic, n, state_dir)
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, **cluster.security)
        try:
            admin.delete_topics([changelog_name])
        finally:
            admin.close()
        shutil.rmtree(state_dir, ignore_errors=True)
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


def build_app(kafka: KafkaConfig, sketch: SketchConfig, cluster: Cluster, state: SketchState,
              partitions: int | None = None, metrics=None, on_fatal=None):
    """The faust App with its table, the batched counting task and the publisher timer; returns (app, state).
    ``partitions``: the table's partition count (the events topic's, :func:`check_state`; default
    ``kafka.partitions``). ``metrics``: a :class:`~.metrics.SketchMetrics` told of the lag and of every
    published hot set. ``on_fatal``: called with the error that stops the counting task when that error is
    the operator's to fix (:func:`is_fatal_line`: a full or read-only disk, a recreated topic under
    ``kafka.on_offsets_lost=fail``); it is to stop the worker and report the error as one line
    (:func:`run_worker`). Without it, such an error crashes the app like any other."""
    import faust

    n_partitions = partitions or kafka.partitions
    app = faust.App(kafka.sketch_group, **faust_settings(cluster, sketch.state_dir, n_partitions))
    table = app.Table(TABLE_NAME, partitions=n_partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})
    counts = CountLoop(app, table, state, kafka, sketch, cluster, n_partitions, on_fatal)
    if on_fatal is not None:
        _quiet_persisted_offsets(table.data, counts.closing)
    publisher = HotSetPublisher(app, raw_topic(app, kafka.hotset_topic), state, counts, kafka, sketch, cluster,
                                changelog_topic(kafka.sketch_group), n_partitions, metrics)
    add_membership(app, {kafka.events_topic}, "sketch-group")
    watch_rebalances(app, {kafka.events_topic}, counts.assigned, counts.revoked)
    app.task(counts.run)
    app.timer(interval=publisher.tick_s, name="sketch-publish")(publisher.publish)
    return app, state


def run_worker(kafka: KafkaConfig, spec: CountingSpec, bootstrap: str, loglevel: str = "warning") -> int:
    """Run the worker until SIGINT/SIGTERM (faust's Worker installs the signal handlers).

    An error the operator must fix (:func:`is_fatal_line`: a full or read-only state directory, a recreated
    topic under ``kafka.on_offsets_lost=fail``) stops the worker as SIGTERM does and is raised here once faust
    has shut down, so the CLI prints it as its one line; its traceback is logged at DEBUG only. Nothing is
    lost: a restart resumes from the last complete partition snapshots."""
    sketch = spec.sketch
    check_writable(sketch.state_dir)
    cluster = Cluster.of(bootstrap, kafka)
    partitions, topic_id = check_state(kafka, sketch.state_dir, cluster)
    state = SketchState(spec, topic_id=topic_id, on_offsets_lost=kafka.on_offsets_lost)
    metrics = None
    if sketch.metrics_port:
        from .metrics import SketchMetrics

        metrics = SketchMetrics(state, sketch.metrics_port, sketch.metrics_host).start()
    fatal: list[BaseException] = []

    def stop(e: BaseException) -> None:
        if not fatal:
            fatal.append(e)
            os.kill(os.getpid(), signal.SIGTERM)  # faust's own graceful stop (its SIGTERM handler)

    app, _ = build_app(kafka, sketch, cluster, state, partitions, metrics=metrics, on_fatal=stop)
    try:
        code = run_app(app, loglevel)
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
