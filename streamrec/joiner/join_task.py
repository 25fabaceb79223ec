"""The joiner's join task: its partitions' impressions and actions in, examples out, one ``tx`` per batch.

:class:`JoinTask` holds what the worker keeps per owned partition (:class:`PartitionCursor`: its store,
where its inputs resume, how far the output log holds its examples), restores a partition when faust
assigns it (:meth:`JoinTask.assigned`) and drops it when revoked, and runs the read-merge-join-send-commit
loop (:meth:`JoinTask.run`): each partition's two topics are joined in event-time order
(:class:`~.input_merge.InputMerge`), and its ``tx`` records the offsets of the records joined, never of
those still waiting in the merge. A batch, a restore and a revocation never overlap (one lock): a restore
reads the output log only once every example already sent for the partition is acknowledged, and a
batch never spans an ownership change.

A batch's examples are acknowledged while the next batch is joined: a batch is joined, closed in its
store (:meth:`~.txstore.TxStore.stage`: the next one reads its changes) and its examples sent; then the
previous batch's acknowledgements are awaited and only then is its ``tx`` committed, so a durable ``tx``
still never lacks an example of its batch. The examples of the batch after it may reach the log first: a
restart from that ``tx`` finds them there by their identities, as it finds any batch's written past a
``tx``'s ends.

With ``join.idle_close_s`` set, a partition that received no record for that long while it holds open windows
or waiting actions has its event time moved on by the wall time passed (:meth:`JoinTask.close_idle`), in a
batch of no records under the same lock and commit as a batch of records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

from streamrec.ingest.ingest_config import KafkaConfig
from streamrec.joiner.join_config import JoinConfig
from streamrec.foundation.failpoints import hit
from streamrec.ingest import REASON_HEADER, SOURCE_HEADER

from .input_merge import InputMerge
from .join_clients import ID_HEADER, IDS_HEADER, JoinClients
from .machine import FEEDBACK_HEADER
from .records import Joiner
from .state_prescan import StatePrescan
from .tx_row import BatchTx
from .txstore import TxStore, dumps

log = logging.getLogger(__name__)


def _impressions_in(item) -> int:
    """What one queued ``(record, decoded)`` counts for in a batch: its impressions (an Arrow record holds
    many), else 1."""
    d = item[1]
    return len(d.body) if d.many else 1


@dataclass
class InFlight:
    """A batch joined, closed in its store and sent, whose acknowledgements and ``tx`` are still to come."""

    tx: BatchTx  # its record but for the output ends, which its acknowledgements give
    stage: int  # its changes in the store (TxStore.stage)
    sends: list  # (events partition, future of a message batch's ack, messages in it)
    dead: list  # futures of its dead letters' acks
    epoch: int  # the partition's ownership it was joined under


class PartitionCursor:
    """What the join task holds for one owned partition, from its last committed batch (``tx``)."""

    def __init__(self, store: TxStore, tx: BatchTx, merge: InputMerge):
        self.store = store
        self.off = dict(tx.off)  # topic -> next offset to read
        self.merge = merge  # the records fetched and not joined yet, in event-time order (not durable)
        self.fetched = dict(tx.off)  # topic -> the offset after the last record fetched (None: none yet)
        self.ends = dict(tx.ends)  # events partition -> offset after our last example
        self.seq = tx.seq
        # identities already in the output log and not produced again yet: the tx's own (found by an earlier
        # restore, written by a run whose batches were never committed) and those past the tx's ends
        self.written: set[str] = set(tx.pending)
        self.epoch = 0
        self.inflight: InFlight | None = None  # the last batch sent, not committed yet
        self.heard = time.monotonic()  # when a record of the partition last arrived (or its event time last moved)

    def refetch(self, newest: dict[str, int | None]) -> None:
        """Drop what the merge holds (``newest``: each topic's watermark in the join): the reader reads
        again from the offsets joined so far."""
        self.merge.clear(newest)
        self.fetched = dict(self.off)

    def batch_tx(self) -> BatchTx:
        """The record of the batch joined so far (its output ends as acknowledged so far), to commit."""
        return BatchTx(seq=self.seq, off=dict(self.off), ends=dict(self.ends), pending=sorted(self.written))


class JoinTask:
    """The join task of one worker over ``table`` (the faust Table of join state)."""

    def __init__(self, table, joiner: Joiner, clients: JoinClients, kafka: KafkaConfig, join: JoinConfig,
                 metrics=None, prescan: StatePrescan | None = None):
        self.table = table
        self.prescan = prescan  # the heaps of the kept local databases, read while the worker joined its group
        self.joiner = joiner
        self.clients = clients
        self.kafka = kafka
        self.join = join
        self.metrics = metrics
        self.topics = {join.impressions_topic, join.actions_topic}
        self.parts: dict[int, PartitionCursor] = {}
        self.epoch: dict[int, int] = {}
        self.batch_lock = asyncio.Lock()

    # -- ownership (faust's rebalances) ------------------------------------

    async def assigned(self, owned: set[int]) -> None:
        """Drop the partitions no longer owned, restore the newly owned ones."""
        async with self.batch_lock:
            for p in list(self.parts):
                if p not in owned:
                    await self.drain(self.parts[p])
                    self.forget(p)
            await self.restore(sorted(owned - set(self.parts)))

    async def revoked(self, lost: set[int]) -> None:
        if lost & set(self.parts):
            hit("join.revoked")  # a rebalance takes owned partitions; a batch of theirs may be in flight
        async with self.batch_lock:
            for p in lost:
                if p in self.parts:
                    await self.drain(self.parts[p])
                    self.forget(p)

    async def drain(self, part: PartitionCursor) -> None:
        """Wait for the acknowledgements of the partition's batch in flight and drop its ``tx`` (the
        partition is leaving this worker, which writes nothing more for it; a restore here later reads the
        output log with them in it)."""
        flight, part.inflight = part.inflight, None
        if flight is not None:
            await self.acked(part, flight)

    def forget(self, p: int) -> None:
        self.parts.pop(p)
        self.joiner.drop(p)
        self.epoch[p] = self.epoch.get(p, 0) + 1

    async def restore(self, ps: list[int]) -> None:
        """Restore partitions ``ps`` from their last ``tx`` each, then read the output log once for the
        examples of theirs already written past the ends their ``tx`` recorded."""
        if not ps:
            return
        await self.clients.start()
        jc = self.join
        parts: dict[int, PartitionCursor] = {}
        read_ahead: set[int] = set()
        for p in ps:
            store = TxStore(self.table, p, jc.impressions_topic, on_hit=hit)
            ahead = self.prescan.take(p, store.fingerprint()) if self.prescan is not None else None
            tx = store.recover()
            # the database changes below only when the last batch is applied again or a first tx is written
            if ahead is not None and tx is not None and not store.outbox:
                read_ahead.add(p)
            else:
                ahead = None
            await self.write_state(p, store)  # the last tx again: a changelog cut short in its applies is completed
            if tx is None:  # a partition never joined: start at the inputs' beginning and the output log's end
                store.commit(BatchTx(seq=0, off={jc.impressions_topic: None, jc.actions_topic: None},
                                     ends=await self.clients.output_ends()))
                await self.write_state(p, store)  # durable before any example: a crash after one finds these ends
                tx = store.last_tx()
            self.joiner.add(p, store, ahead)
            parts[p] = PartitionCursor(store, tx, InputMerge(jc.impressions_topic, jc.actions_topic,
                                                             self.watermarks(p), jc.merge_wait_ms / 1000.0,
                                                             weight=_impressions_in))
        if self.prescan is not None:
            self.prescan.discard()  # what this worker was not given now is not its to restore as read
        written = await self.clients.written_since({p: part.ends for p, part in parts.items()})
        for p, part in parts.items():
            part.written |= written.get(p, set())
            self.epoch[p] = self.epoch.get(p, 0) + 1
            part.epoch = self.epoch[p]
            self.parts[p] = part
            log.info("partition %d: join state restored at batch %d (%d rows%s, %d examples already written)", p,
                     part.seq, self.joiner.machines[p].stats.rows, ", read ahead" if p in read_ahead else "",
                     len(part.written))

    def watermarks(self, p: int) -> dict[str, int | None]:
        """Partition ``p``'s join watermarks by topic: where its merge's running maxima continue."""
        m = self.joiner.machines[p]
        return {self.join.impressions_topic: m.wi, self.join.actions_topic: m.wa}

    # -- durable state --------------------------------------------------------

    async def write_state(self, p: int, store: TxStore) -> None:
        """Produce the store's changelog records to the table's changelog partition ``p``, wait for every
        ack, then write them to the local database with the offsets they reached (:meth:`TxStore.persist`):
        the state written so far is then what a worker rebuilding from the changelog finds, and the local
        copy is the changelog's up to a recorded offset."""
        records = store.take_outbox()
        if not records:
            return
        topic = self.table.changelog_topic.get_topic_name()
        first, last = -1, -1
        for fut, n in await self.clients.produce(topic, p, [(k, v, []) for k, v in records]):
            meta = await fut
            first = meta.offset if first < 0 else min(first, meta.offset)
            last = max(last, meta.offset + n - 1)
        hit("join.before_local")  # the changelog holds the records, the local copy not yet
        store.persist(records, topic, first, last)

    # -- one batch ------------------------------------------------------------

    async def join_batch(self, p: int, recs: list, advance_ms: int = 0) -> InFlight | None:
        """Join ``(record, decoded)`` pairs of partition ``p`` in this order (then move its event time
        ``advance_ms`` on: the idle timeout), close the batch in its store and send its examples; the batch in
        flight (None: the partition is not owned)."""
        part = self.parts.get(p)
        if part is None:
            return None
        examples, bad = [], []
        for rec, decoded in recs:
            hit("join.before_record")
            try:
                examples += self.joiner.apply(p, decoded)
            except ValueError as e:
                self.joiner.malformed += 1
                log.warning("dead letter %s:%d@%d: %s", rec.topic, rec.partition, rec.offset, e)
                bad.append((rec, str(e)))
            part.off[rec.topic] = rec.offset + 1
        if advance_ms:
            examples += self.joiner.advance(p, advance_ms)
        hit("join.before_send")
        sends, dead = await self.send_all(part, examples, bad)
        part.seq += 1
        return InFlight(part.batch_tx(), part.store.stage(), sends, dead, part.epoch)

    async def settle(self, p: int, part: PartitionCursor) -> None:
        """Commit the partition's batch in flight: wait for its acknowledgements, then write its ``tx`` with
        the output ends they give (a batch revoked meanwhile is left to the new owner's replay)."""
        flight, part.inflight = part.inflight, None
        if flight is None:
            return
        await self.acked(part, flight)
        hit("join.after_send")
        if self.parts.get(p) is not part or part.epoch != flight.epoch:
            return  # revoked meanwhile: the new owner resumes from the last tx
        part.store.commit(dataclasses.replace(flight.tx, ends=dict(part.ends)), flight.stage)
        await self.write_state(p, part.store)  # the batch's state in the changelog: a restart resumes after it
        hit("join.after_commit")
        if self.metrics is not None:
            m = self.joiner.machines.get(p)
            if m is not None and m.wa is not None:
                self.metrics.watermark(p, m.wa)

    async def send_all(self, part: PartitionCursor, examples: list, bad: list) -> tuple[list, list]:
        """Send a batch's examples (those not already in the log) and dead letters; the futures of their
        acknowledgements: ``(events partition, future, messages)`` and the dead letters' (:meth:`acked`).

        An example goes to the partition its key (``request_id``) hashes to, as a keyed send would put it.
        JSON: one example per message, its identity in :data:`ID_HEADER`. Arrow: the examples of one
        output partition in messages of up to ``kafka.events_per_message`` events, each message with the
        identities of its examples in :data:`IDS_HEADER` and their kinds (comma-separated, in order) in
        :data:`FEEDBACK_HEADER`; a message is acknowledged whole or not at all, so the identities found in
        the log after a crash are exactly the examples written."""
        topic = self.kafka.events_topic
        partitions_of = await self.clients.partitioner()
        if part.written:
            fresh = []
            for ex in examples:
                if ex[3] in part.written:
                    part.written.discard(ex[3])
                else:
                    fresh.append(ex)
            examples = fresh
        by_q: dict[int, list] = {}
        for q, ex in zip(partitions_of([ex[0] for ex in examples]), examples):
            by_q.setdefault(q, []).append(ex)
        futs = []
        for q, exs in sorted(by_q.items()):
            futs += [(q, f, n) for f, n in await self.clients.produce(topic, q, self.messages(exs))]
        dead = [await self.clients.prod.send(self.kafka.dlq_topic, rec.value or b"", key=rec.key, headers=[
                    (REASON_HEADER, reason[:2000].encode("utf-8", "backslashreplace")),
                    (SOURCE_HEADER, f"{rec.topic}:{rec.partition}:{rec.offset}".encode())]) for rec, reason in bad]
        return futs, dead

    async def acked(self, part: PartitionCursor, flight: InFlight) -> None:
        """Wait for every acknowledgement of ``flight``'s messages; the output ends move past them."""
        for q, f, n in flight.sends:
            meta = await f
            part.ends[q] = max(part.ends.get(q, 0), meta.offset + n)
            hit("join.between_acks")  # some of the batch's messages acknowledged, maybe not all
        for f in flight.dead:
            await f

    def messages(self, exs: list) -> list:
        """One output partition's examples as ``(key, value, headers)`` messages in ``kafka.codec``."""
        if self.kafka.codec == "json":
            return [(key, self.joiner.encode(ev), [(FEEDBACK_HEADER, kind.encode()), (ID_HEADER, ident.encode())])
                    for key, ev, kind, ident in exs]
        step = max(1, int(self.kafka.events_per_message))
        records = []
        for i in range(0, len(exs), step):
            chunk = exs[i:i + step]
            records.append((None, self.joiner.encode_many([ev for _, ev, _, _ in chunk]), [
                (FEEDBACK_HEADER, ",".join(kind for _, _, kind, _ in chunk).encode()),
                (IDS_HEADER, dumps([ident for _, _, _, ident in chunk]))]))
        return records

    # -- the loop -------------------------------------------------------------

    async def run(self) -> None:
        """Read the owned partitions and join them batch by batch, each partition's two topics merged by
        event time (:class:`~.input_merge.InputMerge`), until the app stops."""
        await self.clients.start()
        positioned: dict[int, int] = {}
        try:
            while True:
                positioned = await self.position(positioned)
                if not positioned:
                    await asyncio.sleep(0.2)
                    continue
                got = await self.clients.reader.getmany(timeout_ms=100, max_records=self.join.batch_records)
                self.take(got, positioned)
                for p in sorted(positioned):
                    await self.join_released(p, positioned[p])
                    if self.join.idle_close_s > 0:
                        await self.close_idle(p, positioned[p])
                self.pace(positioned)
        finally:
            await self.clients.stop()

    def take(self, got: dict, positioned: dict[int, int]) -> None:
        """Queue a fetch's records in their partitions' merges (those of partitions positioned for the
        cursor that owns them now)."""
        now = time.monotonic()
        for tp, recs in got.items():
            part = self.parts.get(tp.partition)
            if part is None or part.epoch != positioned.get(tp.partition) or not recs:
                continue
            decode = self.joiner.decode
            items = []
            for rec in recs:
                d = decode(rec.topic, rec.key, rec.value, rec.partition)
                items.append((d.ts, (rec, d)))
            part.merge.add(tp.topic, items, now)
            part.fetched[tp.topic] = recs[-1].offset + 1
            part.heard = now

    async def join_released(self, p: int, epoch: int) -> None:
        """Join, batch by batch, what partition ``p``'s merge releases now: each batch's acknowledgements
        arrive while the next one is joined, and its ``tx`` follows them."""
        while True:
            async with self.batch_lock:
                part = self.parts.get(p)
                if part is None or part.epoch != epoch:
                    return
                released = part.merge.release(self.join.batch_records,
                                              lambda t: part.merge.holds(t, self.behind(p, t, part)))
                if not released:
                    await self.settle(p, part)  # nothing joins now: the last batch is committed, not left waiting
                    return
                flight = await self.join_batch(p, [item for _, item in released])
                await self.settle(p, part)  # the previous batch, acknowledged while this one was joined
                part.inflight = flight

    async def close_idle(self, p: int, epoch: int) -> None:
        """The idle timeout (``join.idle_close_s``): when partition ``p`` received no record for that long, holds
        none in its merge, the reader knows of none not fetched, and it has windows open or actions waiting,
        its event time moves on by the wall time since its last record (or its last such move), in a batch of
        no records: the state change, its examples and the offsets commit in one ``tx``, as a record's do."""
        async with self.batch_lock:
            part = self.parts.get(p)
            now = time.monotonic()
            if part is None or part.epoch != epoch or len(part.merge) or now - part.heard < self.join.idle_close_s:
                return
            if any(self.behind(p, t, part, unanswered=False) for t in self.topics) \
                    or not self.joiner.machines[p].holds_open():
                return
            ms, part.heard = int((now - part.heard) * 1000), now
            await self.settle(p, part)
            part.inflight = await self.join_batch(p, [], advance_ms=ms)
            await self.settle(p, part)

    def behind(self, p: int, topic: str, part: PartitionCursor, unanswered: bool = True) -> bool:
        """Whether the reader knows of records of ``topic`` partition ``p`` not fetched yet (``unanswered``
        when no fetch of it answered yet)."""
        from aiokafka import TopicPartition

        hw = self.clients.reader.highwater(TopicPartition(topic, p))
        if hw is None:
            return unanswered
        at = part.fetched.get(topic)
        return hw > 0 if at is None else at < hw

    def pace(self, positioned: dict[int, int]) -> None:
        """Pause a topic partition whose merge queue holds a batch or more (the other topic is fetched
        meanwhile), resume it below that."""
        from aiokafka import TopicPartition

        reader, full, room = self.clients.reader, [], []
        for p in positioned:
            part = self.parts.get(p)
            if part is None:
                continue
            for t in self.topics:
                (full if part.merge.waiting(t) >= self.join.batch_records else room).append(TopicPartition(t, p))
        if full:
            reader.pause(*full)
        if room:
            reader.resume(*room)

    async def position(self, positioned: dict[int, int]) -> dict[int, int]:
        """Assign the reader the owned partitions of both topics, each at its resume offset, when ownership
        changed since ``positioned`` (partition -> epoch); returns the epochs now positioned."""
        from aiokafka import TopicPartition

        want = {p: part.epoch for p, part in self.parts.items()}
        if want == positioned:
            return positioned
        reader = self.clients.reader
        reader.assign([TopicPartition(t, p) for p in sorted(want) for t in sorted(self.topics)])
        for p in want:
            self.parts[p].refetch(self.watermarks(p))
            for t in self.topics:
                o = self.parts[p].off.get(t)
                if o is None:
                    await reader.seek_to_beginning(TopicPartition(t, p))
                else:
                    reader.seek(TopicPartition(t, p), o)
        return want
