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
  rate times ``join.window_s + join.allowed_lateness_s + join.orphan_wait_s``.
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
  written is not written again. A worker that died uncleanly starts from the changelog, not its local
  RocksDB copy (which may hold writes the changelog never got). Dead letters are at least once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path

from streamrec.foundation import EventSchema, StreamrecError
from streamrec.foundation.failpoints import hit
from streamrec.ingest import (
    REASON_HEADER, SOURCE_HEADER, aiokafka_security, client_settings, encode_arrow, faust_credentials,
)

from .machine import FEEDBACK_HEADER, JoinRules, JoinState, JoinStats, parse_action
from .txstore import TxStore, dumps, loads

log = logging.getLogger(__name__)

TABLE_NAME = "join-state"
ID_HEADER = "streamrec-join-id"  # "<partition>|<request_id>|<kind>|<task>": one example's identity
IDS_HEADER = "streamrec-join-ids"  # a JSON list of the identities of an Arrow message's examples, in order
CLEAN = "clean-shutdown"  # in join.state_dir: the local RocksDB copy matches the changelog


class JoinSetupError(StreamrecError, RuntimeError):
    """The topics the joiner reads cannot be joined as they are; the message says what to do."""


def faust_settings(cfg, bootstrap: str, partitions: int) -> dict:
    """faust App settings: quick group joins, raw keys and values, the state in ``join.state_dir``."""
    return dict(
        broker=f"kafka://{bootstrap}",
        broker_credentials=faust_credentials(client_settings(cfg.kafka)),
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
        # a kept local copy may record a changelog offset above the end ListOffsets answers (the embedded
        # broker answers short of the log end after a batched produce): it is complete (a worker that did not
        # stop cleanly starts from the changelog, run_worker), so nothing is read again instead of a refusal
        recovery_consistency_check=False,
    )


def changelog_topic(cfg) -> str:
    return f"{cfg.join.group}-{TABLE_NAME}-changelog"


def check_copartitioned(cfg, bootstrap: str) -> int:
    """The partition count both input topics share; :class:`JoinSetupError` (one line) when they differ
    or one is missing. Topics keyed by ``request_id`` with equal counts put an impression and its actions
    in the same partition number, which is what the join needs (as Kafka Streams requires of a join)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      **client_settings(cfg.kafka))
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




class Joiner:
    """What the join task does with one record, apart from faust: parse, join, encode. ``retired``: totals
    of the machines dropped at rebalances (the live ones keep their own)."""

    def __init__(self, cfg, metrics=None):
        self.cfg = cfg
        self.rules = JoinRules.from_config(cfg.join)
        self.schema_in = EventSchema.from_config(cfg, require_label=False)
        self.schema_out = EventSchema.from_config(cfg)
        self.machines: dict[int, JoinState] = {}
        self.retired = JoinStats()
        self.malformed = 0
        self.metrics = metrics

    def add(self, p: int, store) -> JoinState:
        on_delay = self.metrics.delay if self.metrics is not None else None
        m = self.machines[p] = JoinState(self.rules, store, on_delay=on_delay)
        return m

    def drop(self, p: int) -> None:
        m = self.machines.pop(p, None)
        if m is None:
            return
        for k, v in vars(m.stats).items():
            if k == "examples":
                for kind, n in v.items():
                    self.retired.examples[kind] += n
            elif k != "rows":
                setattr(self.retired, k, getattr(self.retired, k) + v)

    def totals(self) -> JoinStats:
        out = JoinStats(**{k: v for k, v in vars(self.retired).items() if k != "examples"})
        out.examples = dict(self.retired.examples)
        out.rows = 0
        for m in list(self.machines.values()):
            for k, v in vars(m.stats).items():
                if k == "examples":
                    for kind, n in v.items():
                        out.examples[kind] += n
                else:
                    setattr(out, k, getattr(out, k) + v)
        return out

    def handle(self, p: int, topic: str, key: bytes | None, value: bytes | None) -> list:
        """The examples one record completes, as ``(key, event, kind, identity)``; ValueError: the record is
        malformed (the reason)."""
        try:
            obj = loads(value) if value else None
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from None
        if obj is None:
            raise ValueError("empty record")
        m = self.machines[p]
        if topic == self.cfg.join.impressions_topic:
            rid, ts, ev = self._impression(obj)
            self._check_key(key, rid)
            exs = m.impression(rid, ts, ev)
        else:
            action = parse_action(obj)
            self._check_key(key, action.request_id)
            exs = m.action(action)
        out = []
        for ex in exs:
            task = ""
            if ex.kind == "positive" and self.rules.mode == "fake_negative":
                labels = ex.event.get("labels") or {}
                task = next((t for t, y in labels.items() if y == 1), self.rules.task_names[0])
            kind = "example" if self.rules.mode == "window" else ex.kind
            ident = f"{p}|{ex.request_id}|{kind}|{task}"
            out.append((ex.request_id.encode(), ex.event, ex.kind, ident))
        return out

    def _impression(self, obj) -> tuple[str, int, dict]:
        if not isinstance(obj, dict):
            raise ValueError(f"impression must be a JSON object, got {type(obj).__name__}")
        if "label" in obj or "labels" in obj or "feedback" in obj:
            raise ValueError("an impression carries no label or feedback kind (the joiner sets both from its "
                             "actions)")
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
        """One event as one JSON message (``kafka.codec = json``)."""
        return dumps(ev)

    def encode_many(self, evs: list[dict]) -> bytes:
        """Events as one Arrow IPC message (``kafka.codec = arrow``)."""
        return encode_arrow(self.schema_out.batch_from_events(evs), self.schema_out)


def _keep_paused(consumer, topics: set[str]) -> None:
    """Make faust's consumer never fetch ``topics`` (the join task reads them): recovery resumes every
    assigned partition after each rebalance, so its ``resume_partitions`` leaves theirs out."""
    if getattr(consumer, "_streamrec_keeps_paused", None) == topics:
        return
    resume = consumer.resume_partitions

    def resume_others(tps):
        return resume({tp for tp in tps if tp.topic not in topics})

    consumer.resume_partitions = resume_others
    consumer._streamrec_keeps_paused = topics


class _Partition:
    """What the join task holds for one owned partition."""

    def __init__(self, store: TxStore, tx: dict):
        self.store = store
        self.off = dict(tx["off"])  # topic -> next offset to read
        self.ends = {int(q): o for q, o in tx["ends"].items()}  # events partition -> offset after our last example
        self.seq = tx["seq"]
        # identities already in the output log and not produced again yet: the tx's own (found by an earlier
        # restore, written by a run whose batches were never committed) and those past the tx's ends
        self.written: set[str] = set(tx.get("pending", ()))
        self.epoch = 0


def build_app(cfg, bootstrap: str, partitions: int, metrics=None):
    """The faust App with its table, the membership agent and the join task; returns (app, joiner)."""
    import faust

    jc = cfg.join
    joiner = Joiner(cfg, metrics)
    app = faust.App(jc.group, **faust_settings(cfg, bootstrap, partitions))
    inputs = app.topic(jc.impressions_topic, jc.actions_topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    table = app.Table(TABLE_NAME, partitions=partitions, key_type=bytes, value_type=bytes,
                      options={"driver": "rocksdict"})
    security = aiokafka_security(cfg.kafka)
    topics = {jc.impressions_topic, jc.actions_topic}
    parts: dict[int, _Partition] = {}
    epoch: dict[int, int] = {}
    io: dict = {}
    # a batch, a restore and a revocation never overlap: a restore reads the output log only once every
    # example already sent for the partition is acknowledged, and a batch never spans an ownership change
    batch_lock = asyncio.Lock()

    @app.agent(inputs, name="join-group")
    async def membership(stream):
        # faust's stream of both topics keeps this worker in the group that splits the partitions (and the
        # table's with them); the join task reads the records, their partitions stay paused here
        async for _ in stream.noack().events():
            pass

    async def clients() -> None:
        """Start the reader, the output producer and the output log's scanner once (the first restore can
        come before the join task starts)."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        if "lock" not in io:
            io["lock"] = asyncio.Lock()
        async with io["lock"]:
            if "prod" in io:
                return
            made = dict(
                scan=AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                      client_id="streamrec-join-scan", **security),
                reader=AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                        auto_offset_reset="earliest", client_id="streamrec-join-read", **security),
                prod=AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_batch_size=1 << 20,
                                      max_request_size=32 << 20, client_id="streamrec-join-out", **security))
            for c in made.values():
                await c.start()
            io.update(made)

    async def output_ends() -> dict[int, int]:
        from aiokafka import TopicPartition

        await clients()
        c = io["scan"]
        ps = c.partitions_for_topic(cfg.kafka.events_topic) or set()
        if not ps:
            await c._client.force_metadata_update()
            ps = c.partitions_for_topic(cfg.kafka.events_topic) or set()
        ends = await c.end_offsets([TopicPartition(cfg.kafka.events_topic, q) for q in ps])
        return {tp.partition: int(o) for tp, o in ends.items()}

    async def written_since(p: int, ends: dict[int, int]) -> set[str]:
        """Identities of partition ``p``'s examples in the output log from ``ends`` to its end."""
        from aiokafka import TopicPartition

        c = io["scan"]
        now = await output_ends()
        # every partition, also one whose end looks already reached: the end a broker answers may be short of
        # the log's (the read below goes on until nothing more comes)
        tps = {TopicPartition(cfg.kafka.events_topic, q): ends.get(q, 0) for q in now}
        out: set[str] = set()
        if not tps:
            return out
        c.assign(list(tps))
        for tp, o in tps.items():
            c.seek(tp, max(0, o - 1))  # one before: a broker may answer ListOffsets one short of the log end
        prefix = f"{p}|"
        idle_since = None
        while True:
            got = await c.getmany(timeout_ms=300, max_records=10_000)
            for recs in got.values():
                for r in recs:
                    for k, v in r.headers or ():
                        if k == ID_HEADER:
                            ids = (v.decode(),)
                        elif k == IDS_HEADER:
                            ids = loads(v)
                        else:
                            continue
                        out.update(i for i in ids if i.startswith(prefix))
            done = True
            for tp in tps:
                done = done and await c.position(tp) >= now[tp.partition]
            if got:
                idle_since = None
            elif done:
                if idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 0.5:
                    break
        c.assign([])
        return out

    async def produce(topic: str, q: int, records: list) -> list:
        """Queue ``(key, value, headers)`` records, in order, for partition ``q`` of ``topic`` in as few
        record batches as the producer's batch size allows; the futures of those batches, each with its
        record count."""
        prod = io["prod"]
        futs: list = []
        b, n = prod.create_batch(), 0
        for key, value, headers in records:
            if b.append(timestamp=None, key=key, value=value, headers=headers) is None:
                futs.append((await prod.send_batch(b, topic, partition=q), n))
                b, n = prod.create_batch(), 0
                if b.append(timestamp=None, key=key, value=value, headers=headers) is None:
                    raise StreamrecError(f"join: a record of {len(value or b'')} bytes does not fit a batch")
            n += 1
        if n:
            futs.append((await prod.send_batch(b, topic, partition=q), n))
        return futs

    async def write_state(p: int, store: TxStore) -> None:
        """Produce the store's changelog records to the table's changelog partition ``p`` and wait for
        every ack: the state written so far is then what a worker rebuilding from the changelog finds."""
        records = store.take_outbox()
        if not records:
            return
        from faust.types import TP

        topic = table.changelog_topic.get_topic_name()
        last = -1
        for fut, n in await produce(topic, p, [(k, v, []) for k, v in records]):
            meta = await fut
            last = max(last, meta.offset + n - 1)
        table.data.set_persisted_offset(TP(topic, p), last)  # what faust's own changelog writes record

    async def restore(p: int) -> None:
        await clients()
        store = TxStore(table, p, jc.impressions_topic, on_hit=hit)
        tx = store.recover()
        await write_state(p, store)  # the last tx's applies again: a changelog cut short in them is completed
        if tx is None:  # a partition never joined: start at the inputs' beginning and the output log's end
            tx = {"seq": 0, "off": {jc.impressions_topic: None, jc.actions_topic: None},
                  "ends": {str(q): o for q, o in (await output_ends()).items()}}
            store.commit(tx)
            await write_state(p, store)  # durable before any example: a crash after one finds these ends
            tx = store.last_tx()
        part = _Partition(store, tx)
        part.written |= await written_since(p, part.ends)
        epoch[p] = epoch.get(p, 0) + 1
        part.epoch = epoch[p]
        joiner.add(p, store)
        parts[p] = part
        log.info("partition %d: join state restored at batch %d (%d rows, %d examples already written)", p,
                 part.seq, joiner.machines[p].stats.rows, len(part.written))

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender, **kwargs):
        _keep_paused(app.consumer, topics)
        mine = {tp for tp in app.consumer.assignment() if tp.topic in topics}
        app.consumer.pause_partitions(mine)
        owned = {tp.partition for tp in mine}
        async with batch_lock:
            for p in list(parts):
                if p not in owned:
                    parts.pop(p)
                    joiner.drop(p)
                    epoch[p] = epoch.get(p, 0) + 1
            for p in sorted(owned - set(parts)):
                await restore(p)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender, revoked, **kwargs):
        async with batch_lock:
            for tp in revoked:
                if tp.topic in topics and tp.partition in parts:
                    parts.pop(tp.partition)
                    joiner.drop(tp.partition)
                    epoch[tp.partition] = epoch.get(tp.partition, 0) + 1

    async def send_all(p: int, part: _Partition, examples: list, bad: list) -> None:
        """Send a batch's examples (those not already in the log) and dead letters; wait for every ack.

        An example goes to the partition its key (``request_id``) hashes to, as a keyed send would put it.
        JSON: one example per message, its identity in :data:`ID_HEADER`. Arrow: the examples of one
        output partition in messages of up to ``kafka.events_per_message`` events, each message with the
        identities of its examples in :data:`IDS_HEADER` and their kinds (comma-separated, in order) in
        :data:`FEEDBACK_HEADER`; a message is acknowledged whole or not at all, so the identities found in
        the log after a crash are exactly the examples written."""
        prod, topic = io["prod"], cfg.kafka.events_topic
        if not prod._metadata.partitions_for_topic(topic):
            await prod.client._wait_on_metadata(topic)
        by_q: dict[int, list] = {}
        for key, ev, kind, ident in examples:
            if ident in part.written:
                part.written.discard(ident)
                continue
            q = prod._partition(topic, None, None, None, key, None)
            by_q.setdefault(q, []).append((key, ev, kind, ident))
        futs = []
        for q, exs in sorted(by_q.items()):
            if cfg.kafka.codec == "json":
                records = [(key, joiner.encode(ev), [(FEEDBACK_HEADER, kind.encode()), (ID_HEADER, ident.encode())])
                           for key, ev, kind, ident in exs]
            else:
                step = max(1, int(cfg.kafka.events_per_message))
                records = []
                for i in range(0, len(exs), step):
                    chunk = exs[i:i + step]
                    records.append((None, joiner.encode_many([ev for _, ev, _, _ in chunk]), [
                        (FEEDBACK_HEADER, ",".join(kind for _, _, kind, _ in chunk).encode()),
                        (IDS_HEADER, dumps([ident for _, _, _, ident in chunk]))]))
            futs += [(q, f, n) for f, n in await produce(topic, q, records)]
        dead = []
        for rec, reason in bad:
            dead.append(await prod.send(cfg.kafka.dlq_topic, rec.value or b"", key=rec.key, headers=[
                (REASON_HEADER, reason[:2000].encode("utf-8", "backslashreplace")),
                (SOURCE_HEADER, f"{rec.topic}:{rec.partition}:{rec.offset}".encode())]))
        for q, f, n in futs:
            meta = await f
            part.ends[q] = max(part.ends.get(q, 0), meta.offset + n)
            hit("join.between_acks")  # some of the batch's messages acknowledged, maybe not all
        for f in dead:
            await f

    async def join_batch(p: int, recs: list) -> None:
        part = parts.get(p)
        if part is None:
            return
        at = part.epoch
        examples, bad = [], []
        for rec in recs:
            hit("join.before_record")
            try:
                examples += joiner.handle(p, rec.topic, rec.key, rec.value)
            except ValueError as e:
                joiner.malformed += 1
                log.warning("dead letter %s:%d@%d: %s", rec.topic, rec.partition, rec.offset, e)
                bad.append((rec, str(e)))
            part.off[rec.topic] = rec.offset + 1
        hit("join.before_send")
        await send_all(p, part, examples, bad)
        hit("join.after_send")
        if parts.get(p) is not part or part.epoch != at:
            return  # revoked meanwhile: the new owner resumes from the last tx
        part.seq += 1
        with_ends = {str(q): o for q, o in part.ends.items()}
        part.store.commit({"seq": part.seq, "off": part.off, "ends": with_ends, "pending": sorted(part.written)})
        await write_state(p, part.store)  # the batch's state in the changelog: a restart resumes after it
        hit("join.after_commit")
        if metrics is not None:
            m = joiner.machines.get(p)
            if m is not None and m.wa is not None:
                metrics.watermark(p, m.wa)

    @app.task
    async def join_task():
        from aiokafka import TopicPartition

        await clients()
        reader = io["reader"]
        positioned: dict[int, int] = {}
        try:
            while True:
                want = {p: part.epoch for p, part in parts.items()}
                if want != positioned:
                    tps = [TopicPartition(t, p) for p in sorted(want) for t in sorted(topics)]
                    reader.assign(tps)
                    for p in want:
                        for t in topics:
                            o = parts[p].off.get(t)
                            if o is None:
                                await reader.seek_to_beginning(TopicPartition(t, p))
                            else:
                                reader.seek(TopicPartition(t, p), o)
                    positioned = want
                if not want:
                    await asyncio.sleep(0.2)
                    continue
                got = await reader.getmany(timeout_ms=200, max_records=jc.batch_records)
                by_p: dict[int, list] = {}
                for tp, recs in got.items():
                    by_p.setdefault(tp.partition, []).extend(recs)
                for p, recs in sorted(by_p.items()):
                    async with batch_lock:
                        if parts.get(p) is not None and parts[p].epoch == positioned.get(p):
                            await join_batch(p, recs)
        finally:
            for c in (reader, io["scan"], io["prod"]):
                await c.stop()

    return app, joiner


def run_worker(cfg, bootstrap: str, loglevel: str = "warning") -> int:
    """Run the joiner until SIGINT/SIGTERM (faust's Worker installs the signal handlers). A state directory
    left by a worker that did not stop cleanly is emptied first: faust then rebuilds the table from its
    changelog, which the join's batches were committed to."""
    from faust.worker import Worker

    partitions = check_copartitioned(cfg, bootstrap)
    state = Path(cfg.join.state_dir)
    clean = state / CLEAN
    if state.exists() and any(state.iterdir()) and not clean.exists():
        log.info("%s: the last worker did not stop cleanly; the state is rebuilt from %s", state,
                 changelog_topic(cfg))
        shutil.rmtree(state)
    state.mkdir(parents=True, exist_ok=True)
    clean.unlink(missing_ok=True)
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
    if code == 0:  # faust stopped on a signal and flushed: the local copy matches the changelog
        clean.touch()
    return code
