"""The faust-streaming joiner worker (``streamrec join``): impressions and actions in, labelled events out.

* One agent reads ``join.impressions_topic`` and ``join.actions_topic`` (both keyed by ``request_id``,
  co-partitioned: :func:`check_copartitioned` refuses to start otherwise). Partition ``p`` of both topics is
  joined by one :class:`~.machine.JoinState`, whose state lives in a faust Table on RocksDB (rocksdict
  driver, with its changelog topic) under keys prefixed ``<p>/``: state is bounded by the rate times
  ``join.window_s + join.allowed_lateness_s + join.orphan_wait_s``, never a Python dict of impressions.
  Several workers of one app (``join.group``) split the partitions; after a rebalance each partition's
  machine is rebuilt from the recovered table.
* Examples go to ``kafka.events_topic`` in ``kafka.codec`` (JSON, or one Arrow IPC message per input
  record's examples), keyed by ``request_id``, with their kind in the ``streamrec-feedback`` header
  (:data:`~.machine.FEEDBACK_HEADER`). A record that is not a valid impression or action goes to
  ``kafka.dlq_topic`` with its reason and source (the ``streamrec-error`` / ``streamrec-source`` headers the
  trainer's dead letters carry) and is counted; it never stops the worker.
* Delivery: with ``join.exactly_once`` faust's ``processing_guarantee="exactly_once"`` makes the examples,
  the table's changelog writes and the input offsets one Kafka transaction (a cluster with transactions:
  Apache Kafka; the embedded broker refuses a transactional producer). Without it faust commits offsets
  after processing (at least once): a worker killed between its writes and its commit re-reads records
  whose effects may already be in the changelog, which the join treats as duplicates (an impression
  already held emits nothing again), while an example sent before a state write that was lost is sent
  again. docs/joining.md states what each setting guarantees.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from streamrec.foundation import EventSchema, StreamrecError
from streamrec.foundation.failpoints import hit
from streamrec.ingest import REASON_HEADER, SOURCE_HEADER, client_settings, encode_arrow, encode_json, faust_credentials

from .machine import FEEDBACK_HEADER, JoinRules, JoinState, JoinStats, parse_action

log = logging.getLogger(__name__)

TABLE_NAME = "join-state"


class JoinSetupError(StreamrecError, RuntimeError):
    """The topics the joiner reads cannot be joined as they are; the message says what to do."""


def faust_settings(cfg, bootstrap: str, partitions: int) -> dict:
    """faust App settings: quick group joins, raw keys and values, the state in ``join.state_dir``."""
    out = dict(
        broker=f"kafka://{bootstrap}",
        broker_credentials=faust_credentials(client_settings(cfg)),
        store="rocksdb://",
        datadir=cfg.join.state_dir,
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
    if cfg.join.exactly_once:
        out["processing_guarantee"] = "exactly_once"
    return out


def changelog_topic(cfg) -> str:
    return f"{cfg.join.group}-{TABLE_NAME}-changelog"


def check_copartitioned(cfg, bootstrap: str) -> int:
    """The partition count both input topics share; :class:`JoinSetupError` (one line) when they differ
    or one is missing. Topics keyed by ``request_id`` with equal counts put an impression and its actions
    in the same partition number, which is what the join needs (as Kafka Streams requires of a join)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **client_settings(cfg))
    try:
        imp = c.partitions_for_topic(cfg.join.impressions_topic) or set()
        act = c.partitions_for_topic(cfg.join.actions_topic) or set()
    finally:
        c.close()
    it, at = cfg.join.impressions_topic, cfg.join.actions_topic
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


class _TableKV:
    """A ``MutableMapping`` view of one partition's keys in the faust table (``<p>/`` prefixed, JSON values).
    Written from the agent while it handles a record of partition ``p``: faust sends each write to that
    partition of the changelog."""

    def __init__(self, table, p: int):
        self.table = table
        self.prefix = f"{p}/"

    def _k(self, key: str) -> bytes:
        return (self.prefix + key).encode()

    def get(self, key, default=None):
        raw = self.table.get(self._k(key))
        return default if raw is None else json.loads(raw)

    def __getitem__(self, key):
        raw = self.table.get(self._k(key))
        if raw is None:
            raise KeyError(key)
        return json.loads(raw)

    def __setitem__(self, key, value) -> None:
        self.table[self._k(key)] = json.dumps(value, separators=(",", ":")).encode()

    def __delitem__(self, key) -> None:
        del self.table[self._k(key)]

    def __contains__(self, key) -> bool:
        return self.table.get(self._k(key)) is not None

    def items(self):
        pre = self.prefix.encode()
        for k, v in list(self.table.items()):
            if isinstance(k, bytes) and k.startswith(pre) and v is not None:
                yield k[len(pre):].decode(), json.loads(v)


class Joiner:
    """What the agent does with one record, apart from faust: parse, join, encode. ``stats``: totals of the
    machines dropped at rebalances (the live ones keep their own)."""

    def __init__(self, cfg, metrics=None):
        self.cfg = cfg
        self.rules = JoinRules.from_config(cfg.join)
        self.schema_in = EventSchema.from_config(cfg, require_label=False)
        self.schema_out = EventSchema.from_config(cfg)
        self.machines: dict[int, JoinState] = {}
        self.retired = JoinStats()
        self.malformed = 0
        self.metrics = metrics

    def machine(self, table, p: int) -> JoinState:
        m = self.machines.get(p)
        if m is None:
            on_delay = self.metrics.delay if self.metrics is not None else None
            m = self.machines[p] = JoinState(self.rules, _TableKV(table, p), on_delay=on_delay)
            log.info("partition %d: join state restored, %d rows", p, m.stats.rows)
        return m

    def drop_machines(self) -> None:
        for m in self.machines.values():
            for k, v in vars(m.stats).items():
                if k == "examples":
                    for kind, n in v.items():
                        self.retired.examples[kind] += n
                elif k != "rows":
                    setattr(self.retired, k, getattr(self.retired, k) + v)
        self.machines.clear()

    def totals(self) -> JoinStats:
        out = JoinStats(**{k: v for k, v in vars(self.retired).items() if k != "examples"})
        out.examples = dict(self.retired.examples)
        out.rows = 0
        for m in self.machines.values():
            for k, v in vars(m.stats).items():
                if k == "examples":
                    for kind, n in v.items():
                        out.examples[kind] += n
                else:
                    setattr(out, k, getattr(out, k) + v)
        return out

    def handle(self, table, topic: str, p: int, key: bytes | None, value: bytes | None) -> list:
        """The examples one record completes, as ``(key, encoded value, kind)``; ValueError: malformed."""
        try:
            obj = json.loads(value) if value else None
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from None
        if obj is None:
            raise ValueError("empty record")
        if topic == self.cfg.join.impressions_topic:
            rid, ts, ev = self._impression(obj)
            self._check_key(key, rid)
            exs = self.machine(table, p).impression(rid, ts, ev)
        else:
            action = parse_action(obj)
            self._check_key(key, action.request_id)
            exs = self.machine(table, p).action(action)
        return [(ex.request_id.encode(), self.encode(ex.event), ex.kind) for ex in exs]

    def _impression(self, obj) -> tuple[str, int, dict]:
        if not isinstance(obj, dict):
            raise ValueError(f"impression must be a JSON object, got {type(obj).__name__}")
        if "label" in obj or "labels" in obj:
            raise ValueError("an impression carries no label (the joiner labels it from its actions)")
        rid = obj.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
            raise ValueError("impression: request_id must be a non-empty string or an integer")
        self.schema_in.validate(obj)  # EventError (a ValueError) names the field
        return str(rid), obj.get("ts", 0), obj

    @staticmethod
    def _check_key(key: bytes | None, rid: str) -> None:
        if key is not None and key != rid.encode():
            raise ValueError(f"record key {key[:64]!r} is not its request_id {rid[:64]!r}: both topics must be "
                             "keyed by request_id (co-partitioning)")

    def encode(self, ev: dict) -> bytes:
        if self.cfg.kafka.codec == "json":
            return encode_json(ev)
        return encode_arrow(self.schema_out.batch_from_events([ev]), self.schema_out)


def build_app(cfg, bootstrap: str, partitions: int, metrics=None):
    """The faust App with its table and the join agent; returns (app, joiner)."""
    import faust

    joiner = Joiner(cfg, metrics)
    app = faust.App(cfg.join.group, **faust_settings(cfg, bootstrap, partitions))
    inputs = app.topic(cfg.join.impressions_topic, cfg.join.actions_topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    out = app.topic(cfg.kafka.events_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                    value_serializer="raw")
    dlq = app.topic(cfg.kafka.dlq_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                    value_serializer="raw")
    table = app.Table(TABLE_NAME, partitions=partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender, **kwargs):
        joiner.drop_machines()  # rebuilt from the recovered table at each partition's next record

    @app.agent(inputs)
    async def join(stream):
        async for event in stream.events():
            msg = event.message
            hit("join.before_record")
            try:
                examples = joiner.handle(table, msg.topic, msg.partition, msg.key, msg.value)
            except ValueError as e:
                joiner.malformed += 1
                log.warning("dead letter %s:%d@%d: %s", msg.topic, msg.partition, msg.offset, e)
                await dlq.send(key=msg.key, value=msg.value or b"", headers={
                    REASON_HEADER: str(e)[:2000].encode("utf-8", "backslashreplace"),
                    SOURCE_HEADER: f"{msg.topic}:{msg.partition}:{msg.offset}".encode()})
                continue
            hit("join.after_state")
            for key, value, kind in examples:
                await out.send(key=key, value=value, headers={FEEDBACK_HEADER: kind.encode()})
            if examples:
                hit("join.after_produce")
            if metrics is not None:
                m = joiner.machines.get(msg.partition)
                if m is not None and m.wa is not None:
                    metrics.watermark(msg.partition, m.wa)

    return app, joiner


def run_worker(cfg, bootstrap: str, loglevel: str = "warning") -> int:
    """Run the joiner until SIGINT/SIGTERM (faust's Worker installs the signal handlers)."""
    from faust.worker import Worker

    partitions = check_copartitioned(cfg, bootstrap)
    Path(cfg.join.state_dir).mkdir(parents=True, exist_ok=True)
    metrics = None
    if cfg.join.metrics_port:
        from .metrics import JoinMetrics

        metrics = JoinMetrics(cfg.join.metrics_port, cfg.join.metrics_host)
    app, joiner = build_app(cfg, bootstrap, partitions, metrics)
    if metrics is not None:
        metrics.joiner = joiner
        metrics.start()
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        if metrics is not None:
            metrics.close()
    return code

