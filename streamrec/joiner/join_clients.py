"""The joiner's own Kafka clients: the input reader, the output producer and the output log's scanner.

:class:`JoinClients` starts them once (the first restore can come before the join task starts), produces
records in as few record batches as the producer allows, finds the output log's ends and the identities
of a partition's examples already in it (what a restored partition must not write again), and computes
the output partition a keyed send would choose.
"""

from __future__ import annotations

import asyncio
import time

from streamrec.foundation import StreamrecError
from streamrec.ingest.faust_worker import Cluster

from .key_partitions import partitions_of
from .txstore import loads

ID_HEADER = "streamrec-join-id"  # "<partition>|<request_id>|<kind>|<task>": one example's identity
IDS_HEADER = "streamrec-join-ids"  # a JSON list of the identities of an Arrow message's examples, in order
SCAN_WAIT_MS = 50  # the output log scan's longest wait for one fetch
SCAN_IDLE_S = 0.1  # the scan ends this long after it passed every end with no example of its partitions


class JoinClients:
    """The reader, producer and scanner of one joiner worker, over ``events_topic`` (the output log)."""

    def __init__(self, cluster: Cluster, events_topic: str):
        self.cluster = cluster
        self.events_topic = events_topic
        self.reader = None
        self.prod = None
        self.scan = None
        self._lock: asyncio.Lock | None = None

    async def start(self) -> None:
        """Start the three clients once (later calls return at once)."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.prod is not None:
                return
            bootstrap, security = self.cluster.bootstrap, self.cluster.aiokafka
            # the scan reads to the log's end once per restore: a fetch at the end returns after SCAN_WAIT_MS
            scan = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=SCAN_WAIT_MS, client_id="streamrec-join-scan", **security)
            reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                      auto_offset_reset="earliest", client_id="streamrec-join-read", **security)
            prod = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_batch_size=1 << 20,
                                    max_request_size=32 << 20, client_id="streamrec-join-out", **security)
            for c in (scan, reader, prod):
                await c.start()
            self.scan, self.reader, self.prod = scan, reader, prod

    async def stop(self) -> None:
        for c in (self.reader, self.scan, self.prod):
            if c is not None:
                await c.stop()

    async def output_ends(self) -> dict[int, int]:
        """The end offset of each partition of the output log."""
        from aiokafka import TopicPartition

        await self.start()
        c, topic = self.scan, self.events_topic
        ps = c.partitions_for_topic(topic) or set()
        if not ps:
            await c._client.force_metadata_update()  # aiokafka's consumer has no public metadata refresh
            ps = c.partitions_for_topic(topic) or set()
        ends = await c.end_offsets([TopicPartition(topic, q) for q in ps])
        return {tp.partition: int(o) for tp, o in ends.items()}

    async def written_since(self, ends_of: dict[int, dict[int, int]]) -> dict[int, set[str]]:
        """For each source partition ``p`` in ``ends_of``: the identities of its examples in the output log
        from ``ends_of[p]`` (output partition -> offset) to the log's end; one read of the log for all.

        The log's end is each partition's end when the read begins: the larger of what ListOffsets answers
        and the high watermark of the read's first fetch (a broker may answer ListOffsets short of the log
        end). The read ends once it is past every end and no example of ``ends_of``'s partitions came for
        ``SCAN_IDLE_S``: what other workers go on writing for their own partitions meanwhile does not hold it."""
        from aiokafka import TopicPartition

        c = self.scan
        now = await self.output_ends()
        out: dict[int, set[str]] = {p: set() for p in ends_of}
        if not now or not ends_of:
            return out
        # every partition, also one whose end looks already reached; one before each end: a broker may
        # answer ListOffsets one short of the log end
        since = {p: {q: max(0, ends.get(q, 0) - 1) for q in now} for p, ends in ends_of.items()}
        tps = {TopicPartition(self.events_topic, q): min(s[q] for s in since.values()) for q in now}
        c.assign(list(tps))
        for tp, o in tps.items():
            c.seek(tp, o)
        end, fetched = dict(now), set()  # the ends to read to; the partitions a fetch answered for
        idle_since = None
        while True:
            got = await c.getmany(timeout_ms=SCAN_WAIT_MS, max_records=10_000)
            ours = False
            for tp, recs in got.items():
                for r in recs:
                    for i in _identities(r.headers):
                        p = int(i.split("|", 1)[0])
                        if p in out and r.offset >= since[p][tp.partition]:
                            out[p].add(i)
                            ours = True
            done = True
            for tp in tps:
                hw = c.highwater(tp)
                if hw is not None and tp not in fetched:
                    fetched.add(tp)
                    end[tp.partition] = max(end[tp.partition], int(hw))
                done = done and await c.position(tp) >= end[tp.partition]
            if ours or not done:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > SCAN_IDLE_S:
                break
        c.assign([])
        return out

    async def partitioner(self):
        """``partitions_of(keys)``: the output partition a keyed send of each key goes to (the producer's
        default partitioner over the output log's partitions, as the Java client's: murmur2 of the key)."""
        parts = sorted(await self.prod.partitions_for(self.events_topic))  # waits for metadata when none yet
        return lambda keys: partitions_of(keys, parts)

    async def produce(self, topic: str, q: int, records: list) -> list:
        """Queue ``(key, value, headers)`` records, in order, for partition ``q`` of ``topic`` in as few
        record batches as the producer's batch size allows; the futures of those batches, each with its
        record count."""
        prod = self.prod
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


def _identities(headers) -> list[str]:
    """The example identities one output message's headers name."""
    out: list[str] = []
    for k, v in headers or ():
        if k == ID_HEADER:
            out.append(v.decode())
        elif k == IDS_HEADER:
            out.extend(loads(v))
    return out
