"""The sketch worker's publisher timer: the merged counts' hot set, versioned, onto the hot-set topic.

Every tick :class:`HotSetPublisher` merges the partition sketches, chooses the hot set (FAE policy, off
the event loop) and publishes it under one constant key every ``sketch.publish_interval_s``, or sooner
when the set changed by more than ``sketch.change_fraction``; versions continue from the last one on
the topic. When several workers split the partitions, the one that owns partition 0 publishes the
group's set: its own partitions live plus the newest snapshot of every other partition, read from the
state table's changelog (``sketch/peers.py``); the others publish nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from streamrec.ingest.ingest_config import KafkaConfig
from streamrec.sketch.sketch_config import SketchConfig
from streamrec.ingest.faust_worker import Cluster, owned_partitions

from .count_loop import CountLoop
from .follower import latest_hotset
from .hotset import HotSet
from .peers import PeerSnapshots
from .state import SketchState

log = logging.getLogger(__name__)

HOTSET_KEY = b"hot-set"


class HotSetPublisher:
    """The publisher of one worker. ``changelog``: the state table's changelog topic (the other workers'
    snapshots); ``metrics``: a :class:`~.metrics.SketchMetrics` told of the lag and of every published set."""

    def __init__(self, app, hot_topic, state: SketchState, counts: CountLoop, kafka: KafkaConfig,
                 sketch: SketchConfig, cluster: Cluster, changelog: str, partitions: int, metrics=None):
        self.app = app
        self.hot_topic = hot_topic
        self.state = state
        self.counts = counts
        self.topic = kafka.events_topic
        self.hotset_topic = kafka.hotset_topic
        self.interval = sketch.publish_interval_s
        self.change_fraction = sketch.change_fraction
        self.cluster = cluster
        self.changelog = changelog
        self.partitions = partitions
        self.metrics = metrics
        self.version: int | None = None  # the last version published (None: read it from the topic first)
        self.last: HotSet | None = None  # the set last published (or found on the topic)
        self.at = 0.0  # when a set was last published (or found unchanged at its interval)
        self.events = -1  # the events counted when a set was last published
        self.split_at: float | None = None  # since when the partitions are split among workers
        self.peer_view: PeerSnapshots | None = None

    @property
    def tick_s(self) -> float:
        """How often the timer looks (a quarter of the publish interval, within 0.5 .. 1 s)."""
        return max(0.5, min(1.0, self.interval / 4))

    async def publish(self) -> None:
        """One tick: publish the hot set when it is due or changed enough."""
        if self.counts.stopped:
            return
        if self.metrics is not None:
            self.metrics.observe_lag(self.counts.reader, self.topic)  # the counting task's reader fetches the events
        owned = owned_partitions(self.app, {self.topic})
        peers = None
        if len(owned) < self.partitions:  # several workers split the stream: one publishes the group's set
            peers = self.group_peers(owned)
            if peers is None:
                return
        else:
            self.split_at = None
        if self.version is None:
            prev = latest_hotset(self.cluster.bootstrap, self.hotset_topic, timeout=5.0,
                                 security=self.cluster.security)
            self.version = prev.version if prev else 0
            self.last = prev  # a restarted worker does not republish the set the topic already holds
        now = time.monotonic()
        due = now - self.at >= self.interval
        if not due and self.state.stats.events == self.events and peers is None:
            return
        # off the event loop: choosing scans every candidate and the agent must keep counting meanwhile
        hs = await asyncio.get_running_loop().run_in_executor(None, self.state.choose, self.version + 1, peers)
        if hs is None:
            return
        changed = hs.changed_fraction(self.last)
        version = hs.publish_as(self.last, due, self.change_fraction, self.state.stats.events != self.events)
        if version is None:
            if due:  # unchanged: looked at again at the next interval, not at every tick
                self.at = now
            return
        hs.version = version
        await self.send(hs, now, changed, owned, peers)

    def group_peers(self, owned: set[int]) -> dict[int, bytes] | None:
        """The other workers' partition snapshots, when this worker publishes the group's set (it owns
        partition 0); None when it publishes nothing now (not the publisher, or the others' first snapshots
        are still missing: they get a moment, a partition may have none and then the set goes out anyway)."""
        if 0 not in owned:
            self.version = None  # if partition 0 comes here later, continue from the topic's version
            return None
        if self.peer_view is None:
            self.peer_view = PeerSnapshots(self.cluster.bootstrap, self.changelog, security=self.cluster.security)
        peers = self.peer_view.snapshots(exclude=owned)
        missing = set(range(self.partitions)) - owned - set(peers)
        if self.split_at is None:
            self.split_at = time.monotonic()
        if missing and time.monotonic() - self.split_at < 3 * self.interval:
            return None
        return peers

    async def send(self, hs: HotSet, now: float, changed: float, owned: set[int], peers: dict | None) -> None:
        """Publish ``hs`` and remember it as the last set."""
        await self.hot_topic.send(key=HOTSET_KEY, value=hs.to_bytes())
        self.version, self.last, self.at, self.events = hs.version, hs, now, self.state.stats.events
        if self.metrics is not None:
            self.metrics.published(hs)
        log.info("published hot set v%d: %d rows, coverage %.3f, hit rate %.3f, %d events counted "
                 "(%d malformed records skipped, changed %.2f; %s)", hs.version, hs.rows, hs.coverage,
                 hs.hit_rate, hs.events, self.state.stats.bad_records, changed,
                 "this worker's partitions only" if peers is None else
                 f"partitions {sorted(owned)} live + {len(peers)} from other workers' snapshots")
