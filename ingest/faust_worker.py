"""What the faust workers (the sketch's and the joiner's) share: a worker that reads its own partitions.

Both workers let faust's consumer group decide which partitions they own, and read those partitions
with a reader of their own (batched, positioned where their state says). This module holds that
pattern once:

* :class:`Cluster`: the bootstrap servers and the security settings of the worker's own clients;
* :func:`worker_settings`: the faust App settings both use (quick group joins, raw keys and values,
  RocksDB tables in the worker's state directory, the cluster's security settings);
* :func:`add_membership`: the agent whose stream of the input topics keeps the worker in the group;
* :func:`watch_rebalances`: after each rebalance, faust's consumer keeps the input topics' partitions
  paused (also through its recovery, which resumes every assigned partition) and the worker is told the
  partitions it owns now; at a revocation, the partitions it lost;
* :func:`at_partition`: a table write that goes to a chosen partition (the current event's, for faust);
* :func:`run_app`: faust's Worker until SIGINT/SIGTERM, returning its exit code.

faust loads only when a function here runs: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import time
import types
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Iterator

from streamrec.ingest.ingest_config import KafkaConfig

PartitionsHook = Callable[[set[int]], Awaitable[None]]


@dataclass(frozen=True)
class Cluster:
    """Where a worker's own Kafka clients connect, with the cluster's security settings for each library."""

    bootstrap: str
    security: dict[str, Any]  # kafka-python keyword arguments (``client_settings``)
    aiokafka: dict[str, Any]  # the same as aiokafka keyword arguments (``aiokafka_security``)

    @classmethod
    def of(cls, bootstrap: str, kafka: KafkaConfig) -> "Cluster":
        """The cluster at ``bootstrap`` with ``kafka``'s security settings (KafkaSecurityError: they are wrong)."""
        from .kafka_clients import aiokafka_security, client_settings

        return cls(bootstrap, client_settings(kafka), aiokafka_security(kafka))


def worker_settings(cluster: Cluster, state_dir: str, partitions: int, **extra: Any) -> dict[str, Any]:
    """faust App settings for a worker that reads its own partitions: quick group joins (a 6 s session,
    Apache Kafka's least by default: the embedded broker holds a JoinGroup for half the session timeout; a
    3 s rebalance timeout for members to rejoin), raw keys and values, RocksDB tables under ``state_dir`` with
    ``partitions`` partitions, and the cluster's security settings as ``broker_credentials``; ``extra`` adds
    or replaces settings."""
    from .kafka_clients import faust_credentials

    settings: dict[str, Any] = dict(
        broker=f"kafka://{cluster.bootstrap}",
        broker_credentials=faust_credentials(cluster.security),
        store="rocksdb://",
        datadir=state_dir,
        web_enabled=False,
        topic_partitions=partitions,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        broker_rebalance_timeout=3.0,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        producer_max_request_size=32 << 20,
        stream_wait_empty=False,
    )
    settings.update(extra)
    return settings


def raw_topic(app, *names: str):
    """A faust topic of raw bytes keys and values over ``names``."""
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def add_membership(app, topics: Collection[str], name: str) -> None:
    """Register the agent ``name`` whose stream of ``topics`` keeps the worker in the consumer group that
    splits their partitions (and its tables' with them). The worker's own reader reads the records: the
    partitions stay paused (:func:`watch_rebalances`), and what faust fetched before a pause took effect is
    left to that reader (nothing is acked or committed here)."""
    channel = raw_topic(app, *sorted(topics))

    async def membership(stream):
        async for _ in stream.noack().events():
            pass

    app.agent(channel, name=name)(membership)


def keep_paused(consumer, topics: Collection[str]) -> None:
    """Make faust's ``consumer`` never fetch ``topics`` (the worker's reader reads them): faust's recovery
    resumes every assigned partition after each rebalance, so its ``resume_partitions`` leaves theirs out.
    Idempotent: a consumer already wrapped for the same topics is left as it is."""
    wanted = frozenset(topics)
    if getattr(consumer.resume_partitions, "keeps_paused", None) == wanted:
        return
    resume = consumer.resume_partitions

    def resume_others(tps):
        return resume({tp for tp in tps if tp.topic not in wanted})

    resume_others.keeps_paused = wanted  # type: ignore[attr-defined]
    consumer.resume_partitions = resume_others


def owned_partitions(app, topics: Collection[str]) -> set[int]:
    """The partition numbers of ``topics`` assigned to this worker now."""
    return {tp.partition for tp in app.consumer.assignment() if tp.topic in topics}


def watch_rebalances(app, topics: Collection[str], on_assigned: PartitionsHook, on_revoked: PartitionsHook) -> None:
    """Connect the worker to faust's rebalance signals for ``topics`` (co-partitioned: a partition number
    names the same partition of each).

    When a rebalance completes (faust's tables are recovered by then), the topics' assigned partitions are
    paused in faust's consumer and kept paused (:func:`keep_paused`), then ``on_assigned`` gets the partition
    numbers the worker owns now. When partitions are revoked, ``on_revoked`` gets those of ``topics``."""
    names = frozenset(topics)

    async def rebalance_complete(sender, **kwargs) -> None:
        keep_paused(app.consumer, names)
        mine = {tp for tp in app.consumer.assignment() if tp.topic in names}
        app.consumer.pause_partitions(mine)
        await on_assigned({tp.partition for tp in mine})

    async def partitions_revoked(sender, revoked, **kwargs) -> None:
        await on_revoked({tp.partition for tp in revoked if tp.topic in names})

    app.on_rebalance_complete.connect(rebalance_complete)
    app.on_partitions_revoked.connect(partitions_revoked)


class _PartitionEvent:
    """Stands in for faust's current event: faust reads and writes a table key in the current event's
    partition (its RocksDB partition and changelog partition)."""

    def __init__(self, topic: str, partition: int):
        self.message = types.SimpleNamespace(topic=topic, partition=partition, timestamp=time.time())


@contextlib.contextmanager
def at_partition(topic: str, p: int) -> Iterator[None]:
    """Table reads and writes inside go to partition ``p`` (as for an event of ``topic``'s partition ``p``)."""
    # faust names the current event only in this context variable: a table write outside an agent's
    # event (the workers write from their own tasks) sets it to choose the partition
    from faust.streams import _current_event

    event = _PartitionEvent(topic, p)  # held here: the context variable holds a weak reference
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def run_app(app, loglevel: str) -> int:
    """Run ``app`` in faust's Worker until SIGINT/SIGTERM (the Worker installs the signal handlers); the
    exit code it stops with."""
    from faust.worker import Worker

    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        return int(e.code or 0)
    return 0
