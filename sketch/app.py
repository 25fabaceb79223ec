"""The faust-streaming sketch worker: events in, versioned hot sets out.

* The agent reads the events topic as raw bytes (``noack`` stream), decodes each
  record with the ingest decoder and counts it in its partition's sketch.
* State: a faust Table on RocksDB (``store="rocksdb://"``, rocksdict driver),
  key ``p<partition>`` -> that partition's sketch snapshot with the offset after
  the last record it includes. Snapshots are written every
  ``sketch.checkpoint_interval_s`` while processing that partition's records
  (so the changelog partition matches), and only then are those records
  acked: faust commits source offsets only for acked records, so a worker
  killed with SIGKILL restarts at or before its snapshot and the offset in
  the snapshot skips anything counted already -- counts resume, nothing is
  lost or counted twice.
* A timer merges the partition sketches, chooses the hot set (FAE policy) and
  publishes it to the compacted ``hot-set`` topic under one constant key every
  ``sketch.publish_interval_s``, or sooner when the set changed by more than
  ``sketch.change_fraction``. Versions continue from the last one on the topic.
* Several workers of one app split the partitions (faust's consumer group). The
  worker that owns partition 0 publishes the group's hot set: its own partitions
  live plus the newest snapshot of every other partition, read from the table's
  changelog (``sketch/peers.py``); the others publish nothing.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import weakref
from pathlib import Path

from streamrec.ingest import RecordMarker

from .follower import latest_hotset
from .peers import PeerSnapshots
from .state import SketchState

log = logging.getLogger(__name__)

HOTSET_KEY = b"hot-set"
TABLE_NAME = "sketch-state"
INFLIGHT = "inflight.bin"  # the record being counted (streamrec.ingest.inflight.RecordMarker), in the state dir


def faust_settings(cfg, bootstrap: str) -> dict:
    """faust App settings tuned for quick group joins (the embedded broker waits a full rebalance timeout)."""
    return dict(
        broker=f"kafka://{bootstrap}",
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
        # a partition snapshot is ~1-3 MB (count-min cells); hot sets can be large too
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

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
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
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.delete_topics([changelog_topic(cfg)])
        finally:
            admin.close()
        shutil.rmtree(cfg.sketch.state_dir, ignore_errors=True)
    return n, (str(events_id) if events_id is not None else None)


def build_app(cfg, bootstrap: str, state: SketchState | None = None, partitions: int | None = None):
    """The faust App with its agent, table and publisher timer; returns (app, state)."""
    import faust
    from faust.streams import _current_event

    state = state or SketchState(cfg)
    marker = RecordMarker(Path(cfg.sketch.state_dir) / INFLIGHT)
    if marker.found is not None:
        log.error("the previous worker process died handling p%d@%d; that record is skipped", *marker.found)
        state.quarantine.add(marker.found)
    app = faust.App(cfg.kafka.sketch_group, **faust_settings(cfg, bootstrap))
    events = app.topic(cfg.kafka.events_topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    hot_topic = app.topic(cfg.kafka.hotset_topic, key_type=bytes, value_type=bytes,
                          key_serializer="raw", value_serializer="raw")
    table = app.Table(TABLE_NAME, partitions=partitions or cfg.kafka.partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})
    pending: dict[int, list] = {}
    last_ckpt: dict[int, float] = {}
    interval = cfg.sketch.checkpoint_interval_s

    def checkpoint(p: int) -> None:
        """Snapshot partition ``p`` into the table, then ack the records the snapshot covers."""
        evs = pending.pop(p, None)
        last_ckpt[p] = time.monotonic()
        if not evs:
            return
        # faust sends a table write's changelog to the partition of the *current event*; outside the
        # agent's iteration (the idle timer below) there is none, so point it at this partition's last one
        token = _current_event.set(weakref.ref(evs[-1]))
        try:
            table[b"p%d" % p] = state.snapshot(p)
        finally:
            _current_event.reset(token)
        for e in evs:
            e.ack()

    def restore(p: int, why: str) -> None:
        blob = table.get(b"p%d" % p)
        log.info("partition %d: %s, snapshot %s", p, why, f"{len(blob)} bytes" if blob else "none")
        state.restore(p, blob)
        last_ckpt[p] = time.monotonic()

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender, **kwargs):
        # take every assigned partition's snapshot now (the table is recovered by then), not only when its
        # next record arrives: a restarted worker published hot sets chosen from the partitions that had
        # new records only, and nothing at all while the stream was quiet
        for tp in app.consumer.assignment():
            if tp.topic == cfg.kafka.events_topic and not state.has(tp.partition):
                restore(tp.partition, "assigned")

    @app.agent(events, name="sketch-count")
    async def count(stream):
        async for ev in stream.noack().events():
            p = ev.message.partition
            if not state.has(p):
                restore(p, f"first record at offset {ev.message.offset}")
            marker.begin(p, ev.message.offset)  # a native crash in here is skipped by the next start
            state.apply(p, ev.message.offset, ev.value)
            marker.end()
            pending.setdefault(p, []).append(ev)
            if time.monotonic() - last_ckpt[p] >= interval:
                checkpoint(p)

    @app.timer(interval=max(0.1, interval / 2), name="sketch-checkpoint")
    async def checkpoint_idle():
        # a partition that went quiet still gets its last records snapshotted and acked
        now = time.monotonic()
        for p in list(pending):
            if now - last_ckpt.get(p, 0.0) >= interval:
                checkpoint(p)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender, revoked, **kwargs):
        # another worker takes these over and resumes from their snapshots: drop our copies
        for tp in revoked:
            if tp.topic == cfg.kafka.events_topic:
                state.drop(tp.partition)
                pending.pop(tp.partition, None)

    pub = {"version": None, "last": None, "at": 0.0, "events": -1}
    tick = max(0.5, min(1.0, cfg.sketch.publish_interval_s / 4))
    n_partitions = partitions or cfg.kafka.partitions
    peers_box: dict[str, PeerSnapshots] = {}

    @app.timer(interval=tick, name="sketch-publish")
    async def publish():
        owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == cfg.kafka.events_topic}
        peers = None
        if len(owned) < n_partitions:  # several workers split the stream: one publishes the group's set
            if 0 not in owned:
                pub["version"] = None  # if partition 0 comes here later, continue from the topic's version
                return
            if "view" not in peers_box:
                peers_box["view"] = PeerSnapshots(bootstrap, changelog_topic(cfg))
            peers = peers_box["view"].snapshots(exclude=owned)
            missing = set(range(n_partitions)) - owned - set(peers)
            pub.setdefault("split_at", time.monotonic())
            if missing and time.monotonic() - pub["split_at"] < 3 * cfg.sketch.publish_interval_s:
                return  # give the other workers' first snapshots a moment (a partition may have none: then go on)
        else:
            pub.pop("split_at", None)
        if pub["version"] is None:
            prev = latest_hotset(bootstrap, cfg.kafka.hotset_topic, timeout=5.0)
            pub["version"] = prev.version if prev else 0
        now = time.monotonic()
        due = now - pub["at"] >= cfg.sketch.publish_interval_s
        if not due and state.stats.events == pub["events"] and peers is None:
            return
        # off the event loop: choosing takes ~0.1 s and the agent must keep counting meanwhile
        hs = await asyncio.get_running_loop().run_in_executor(None, state.choose, pub["version"] + 1, peers)
        if hs is None:
            return
        changed = hs.changed_fraction(pub["last"])
        if not due and changed <= cfg.sketch.change_fraction:
            return
        await hot_topic.send(key=HOTSET_KEY, value=hs.to_bytes())
        pub.update(version=hs.version, last=hs, at=now, events=state.stats.events)
        log.info("published hot set v%d: %d rows, coverage %.3f, hit rate %.3f, %d events counted "
                 "(%d malformed records skipped, changed %.2f; %s)", hs.version, hs.rows, hs.coverage,
                 hs.hit_rate, hs.events, state.stats.bad_records, changed,
                 "this worker's partitions only" if peers is None else
                 f"partitions {sorted(owned)} live + {len(peers)} from other workers' snapshots")

    return app, state


def run_worker(cfg, bootstrap: str, loglevel: str = "warning") -> int:
    """Run the worker until SIGINT/SIGTERM (faust's Worker installs the signal handlers)."""
    from faust.worker import Worker

    partitions, topic_id = check_state(cfg, bootstrap)
    state = SketchState(cfg, topic_id=topic_id)
    app, _ = build_app(cfg, bootstrap, state, partitions)
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        return int(e.code or 0)
    return 0
