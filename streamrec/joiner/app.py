"""The faust-streaming joiner worker (``streamrec join``): impressions and actions in, labelled events out.

* faust's consumer group decides which partitions of ``join.impressions_topic`` and ``join.actions_topic``
  (both keyed by ``request_id``, co-partitioned: :func:`check_copartitioned` refuses to start otherwise) this
  worker owns; several workers of one app (``join.group``) split them. The records are read by the join task
  with its own reader, positioned where the partition's state says; faust's consumer keeps those topics
  paused.
* Partition ``p`` of both topics is joined by one :class:`~.machine.JoinState` whose state lives in a faust
  Table on RocksDB (rocksdict driver, with its changelog topic), committed per batch of at most
  ``join.batch_records`` records as one atomic ``tx`` (``txstore.py``): the input offsets after the batch
  and the output log's end offsets travel in it. The state's writes go to the partition's RocksDB database
  and, through this worker's producer, to the table's changelog in record batches. State is bounded by the
  rate times the longest task window (``join.window_s``, or a task's ``@window_s``) plus
  ``join.allowed_lateness_s + join.orphan_wait_s``.
* Examples go to ``kafka.events_topic``, each to the partition its ``request_id`` hashes to, in
  ``kafka.codec``: JSON, one example per message keyed by ``request_id``, its kind in the
  ``streamrec-feedback`` header (:data:`~.machine.FEEDBACK_HEADER`) and its identity (source partition,
  request id, kind, task) in ``streamrec-join-id``; or Arrow, up to ``kafka.events_per_message`` examples per
  message, their kinds (comma-separated) and identities (a JSON list in ``streamrec-join-ids``) in order. A
  record that is not a valid impression or action goes to ``kafka.dlq_topic`` with its reason and source
  (``streamrec-error`` / ``streamrec-source``, as the trainer's dead letters) and is counted.
* Exactly once without Kafka transactions (the embedded broker has none): a batch's examples are sent and
  acknowledged before its ``tx`` is written, so a durable ``tx`` never lacks its examples; after a crash the
  partition resumes from its last ``tx`` (the join is deterministic: the same records give the same
  examples) and first reads the output log from the ends that ``tx`` recorded, so an example already
  written is not written again. Dead letters are at least once.
* Restarts in seconds: a batch reaches the local RocksDB copy only after the changelog acknowledged it,
  with the changelog offset it reached, so a restarted worker (also after ``kill -9``) keeps each copy that
  :func:`~.local_state.check_local_state` finds written against this changelog, and faust reads the
  changelog only past that offset; any other copy is removed and rebuilt from the changelog.
"""

from __future__ import annotations

import logging
from pathlib import Path

from streamrec.foundation import EventSchema, StreamrecError
from streamrec.ingest.ingest_config import KafkaConfig
from streamrec.joiner.join_config import JoinConfig
from streamrec.ingest.faust_worker import Cluster, add_membership, run_app, watch_rebalances, worker_settings

from .group_member import leave_as_before, worker_client_id
from .join_clients import ID_HEADER, IDS_HEADER, JoinClients
from .join_task import JoinTask
from .local_state import check_local_state, partition_dbs
from .machine import JoinRules
from .records import Joiner
from .state_prescan import StatePrescan

log = logging.getLogger(__name__)

__all__ = ["ID_HEADER", "IDS_HEADER", "TABLE_NAME", "JoinSetupError", "Joiner", "build_app",
           "changelog_topic", "check_copartitioned", "faust_settings", "run_worker"]

TABLE_NAME = "join-state"


class JoinSetupError(StreamrecError, RuntimeError):
    """The topics the joiner reads cannot be joined as they are; the message says what to do."""


def faust_settings(cluster: Cluster, state_dir: str, partitions: int) -> dict:
    """faust App settings of the joiner (:func:`~streamrec.ingest.faust_worker.worker_settings`), its state
    in ``state_dir`` (``join.state_dir``), its Kafka client id the one kept there
    (:func:`~.group_member.worker_client_id`)."""
    # a kept local copy may record a changelog offset above the end ListOffsets answers (the embedded
    # broker answers short of the log end after a batched produce): it is complete (run_worker keeps only
    # a copy whose checkpoint record the changelog holds), so nothing is read again instead of a refusal
    # the table is declared before the app starts: faust's one-second wait for late tables is not needed
    return worker_settings(cluster, state_dir, partitions, recovery_consistency_check=False,
                           TableManager="streamrec.joiner.faust_tables:PromptTableManager",
                           broker_client_id=worker_client_id(state_dir))


def changelog_topic(group: str) -> str:
    """faust's changelog topic of the join table of the app ``group`` (``join.group``)."""
    return f"{group}-{TABLE_NAME}-changelog"


def check_copartitioned(join: JoinConfig, cluster: Cluster) -> int:
    """The partition count both input topics share; :class:`JoinSetupError` (one line) when they differ
    or one is missing. Topics keyed by ``request_id`` with equal counts put an impression and its actions
    in the same partition number, which is what the join needs (as Kafka Streams requires of a join)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=None, enable_auto_commit=False,
                      **cluster.security)
    try:
        imp = c.partitions_for_topic(join.impressions_topic) or set()
        act = c.partitions_for_topic(join.actions_topic) or set()
    finally:
        c.close()
    it, at = join.impressions_topic, join.actions_topic
    for name, parts in ((it, imp), (at, act)):
        if not parts:
            raise JoinSetupError(f"join: topic {name} does not exist: create it (keyed by request_id) with the "
                                 f"same partition count as {at if name == it else it}, or let `streamrec join "
                                 "--create-topics` create both")
    if len(imp) != len(act):
        raise JoinSetupError(
            f"join: {it} has {len(imp)} partitions and {at} has {len(act)}: the topics are not co-partitioned; "
            f"give both the same partition count (e.g. kafka-topics --alter --topic "
            f"{at if len(act) < len(imp) else it} --partitions {max(len(imp), len(act))}, before keys are written "
            "to the new partitions) and key both by request_id")
    return len(imp)


def build_app(kafka: KafkaConfig, join: JoinConfig, schema: EventSchema, cluster: Cluster, partitions: int,
              metrics=None, prescan: StatePrescan | None = None):
    """The faust App with its table, the membership agent and the join task; returns (app, joiner).
    ``schema``: the labelled events the joiner writes to ``kafka.events_topic``; ``prescan``: the read-ahead
    of the kept local databases (the table manager's ``read_ahead``, finished before faust opens them)."""
    import faust

    joiner = Joiner(join, schema, metrics, partitions)
    app = faust.App(join.group, **faust_settings(cluster, join.state_dir, partitions))
    table = app.Table(TABLE_NAME, partitions=partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})
    app.tables.read_ahead = prescan  # the PromptTableManager of faust_settings
    task = JoinTask(table, joiner, JoinClients(cluster, kafka.events_topic), kafka, join, metrics, prescan)
    add_membership(app, task.topics, "join-group")
    watch_rebalances(app, task.topics, task.assigned, task.revoked)
    app.task(task.run)
    return app, joiner


def tune_gc() -> None:
    """Garbage collection for the join's allocation pattern: each record allocates a few dicts and lists,
    nearly all freed by their reference counts at once, so the collector's default (a young collection
    every 700 allocations, each older one scanning every module, faust's and Kafka clients' objects)
    spends much of the join's time finding no garbage. The objects alive after the worker is built are
    moved out of the collector's scans (``gc.freeze``; reference counting still frees them) and young
    collections come every 20,000 allocations."""
    import gc

    gc.set_threshold(20_000, 50, 100)
    gc.freeze()


def run_worker(kafka: KafkaConfig, join: JoinConfig, schema: EventSchema, bootstrap: str,
               loglevel: str = "warning") -> int:
    """Run the joiner until SIGINT/SIGTERM (faust's Worker installs the signal handlers). Each local partition
    database in ``join.state_dir`` is checked first (:func:`~.local_state.check_local_state`): one written
    against this changelog is kept and faust reads the changelog only past its offset; any other is removed
    and faust rebuilds that partition from the changelog."""
    cluster = Cluster.of(bootstrap, kafka)
    partitions = check_copartitioned(join, cluster)
    state = Path(join.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    verdict = check_local_state(state, TABLE_NAME, changelog_topic(join.group), cluster.bootstrap,
                                cluster.security)
    kept = {p: path for p, path in partition_dbs(state, TABLE_NAME).items() if verdict.get(p) == "kept"}
    prescan = StatePrescan(kept, JoinRules.from_config(join))
    leave_as_before(cluster, join.group, worker_client_id(state))
    metrics = None
    if join.metrics_port:
        from .metrics import JoinMetrics

        metrics = JoinMetrics(join.metrics_port, join.metrics_host)
    app, joiner = build_app(kafka, join, schema, cluster, partitions, metrics, prescan)
    if metrics is not None:
        metrics.joiner = joiner
        metrics.start()
    tune_gc()
    try:
        return run_app(app, loglevel)
    finally:
        prescan.finish()
        if metrics is not None:
            metrics.close()
