"""The sketch worker's counting path: the partitions it owns, read in large batches.

faust's per-message stream costs far more per record than counting one event
does (one callback and one message object per record). So faust keeps what it is
good at -- the consumer group that decides which worker owns which partition,
the state table, its changelog and recovery, the hot-set topic -- and the
records themselves are read by :class:`PartitionReader`: a plain aiokafka
consumer (faust's own client; C record parsing) on the same event loop,
manually assigned to the events partitions faust gave this worker, fetching
thousands of records per call. It belongs to no group and commits nothing: each
partition's snapshot in the table carries the offset after the last record it
counted, and the reader is positioned there, so a restarted worker (kill -9
included) resumes exactly where its snapshot ends. The group's committed
offsets mirror the snapshots for monitoring (``sketch/commits.py``).

:class:`BatchMarker` is the crash-loop breaker for batches: before a batch is
counted its offset range is written down; a worker that dies on it leaves the
range, and the next start decodes those records one by one in a child process
(``probe_decode``) and skips the ones that kill it. A death the probe cannot
reproduce, striking the same range again, gets that range skipped whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

from streamrec.ingest import InflightMarker, InflightRange, probe_decode

log = logging.getLogger(__name__)

COUNT = "count"  # the marker phase: decoding and counting a batch


class PartitionReader:
    """Batched reads of some partitions of one topic, each positioned where the caller says."""

    def __init__(self, bootstrap: str, topic: str, max_records: int, security: dict | None = None):
        self.bootstrap = bootstrap
        self.security = security or {}  # aiokafka's security keyword arguments (:func:`aiokafka_security`)
        self.topic = topic
        self.max_records = max_records
        self._consumer = None
        self._owned: dict[int, int] = {}  # partition -> offset it was last positioned at by follow()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest",  # a snapshot's offset the log no longer holds: its oldest record
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20,
            client_id="streamrec-sketch-count", **self.security)
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def follow(self, positions: dict[int, int], reseek: set[int] = frozenset()) -> None:
        """Read exactly the partitions in ``positions``; one new to the reader, or in ``reseek`` (restored
        from a snapshot since), starts at its offset there; the others go on where they are."""
        from aiokafka import TopicPartition

        changed = set(positions) != set(self._owned)
        if changed:
            self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(positions)])
            log.info("counting partitions %s of %s", sorted(positions) or "none", self.topic)
        for p, offset in positions.items():
            if p not in self._owned or p in reseek or changed:
                self._consumer.seek(TopicPartition(self.topic, p), offset)
        self._owned = dict(positions)

    def assignment(self) -> set:
        """The partitions read now (aiokafka TopicPartitions), as a consumer's ``assignment()``."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    def highwater(self, tp) -> int | None:
        """The partition's end offset as of the last fetch (None before one): the lag metric's reference."""
        return self._consumer.highwater(tp) if self._consumer is not None else None

    async def log_bounds(self, partitions) -> tuple[dict[int, int], dict[int, int]]:
        """Each partition's first and end offset (ListOffsets), as ``({partition: first}, {partition: end})``."""
        from aiokafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        if not tps:
            return {}, {}
        begin = await self._consumer.beginning_offsets(tps)
        end = await self._consumer.end_offsets(tps)
        return {tp.partition: int(o) for tp, o in begin.items()}, {tp.partition: int(o) for tp, o in end.items()}

    async def read(self, timeout_ms: int) -> dict[int, list]:
        """Up to ``max_records`` records, by partition, in offset order (empty after ``timeout_ms``)."""
        if not self._owned:
            return {}
        got = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
        return {tp.partition: recs for tp, recs in got.items() if recs and tp.partition in self._owned}


class BatchMarker:
    """The batch being counted, in a marker file (``ingest.InflightMarker``: one small write per batch)."""

    def __init__(self, path: str | Path, topic: str, schema):
        self.marker = InflightMarker(path)
        self.topic = topic
        self.schema = schema
        self.suspect = self.marker.found  # (phase, ranges, deaths) left by a worker that died counting
        if self.suspect is not None:
            _, ranges, deaths = self.suspect
            log.error("the previous worker process died counting records %s (deaths so far: %d); they are %s",
                      ", ".join(f"p{r.partition}@{r.first}-{r.last}" for r in ranges), deaths + 1,
                      "probed in a child process" if deaths == 0 else "skipped")

    def _suspect_range(self, partition: int, offsets: list[int]):
        if self.suspect is None:
            return None
        for r in self.suspect[1]:
            if r.partition == partition and r.first <= offsets[-1] and offsets[0] <= r.last:
                return r
        return None

    def begin(self, partition: int, offsets: list[int], values: list) -> set[int]:
        """Mark the batch as being counted; returns the offsets to skip (they killed a predecessor)."""
        r = self._suspect_range(partition, offsets)
        deaths = 0
        skip: set[int] = set()
        if r is not None:
            deaths = self.suspect[2] + 1
            held = [i for i, o in enumerate(offsets) if r.first <= o <= r.last]
            if deaths == 1:  # first death: find the culprit(s) by decoding each suspect record in a child
                skip = {offsets[held[i]] for i in probe_decode(self.schema, [values[i] or b"" for i in held])}
            else:  # the probe did not reproduce it, and the same records killed a worker again
                skip = {offsets[i] for i in held}
            if offsets[-1] >= r.last:
                self.suspect = None  # every suspect record is handled in this batch
        self.marker.mark(COUNT, [InflightRange(self.topic, partition, offsets[0], offsets[-1])], deaths)
        return skip

    def clear(self) -> None:
        self.marker.clear()
