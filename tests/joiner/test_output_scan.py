"""The output log's scan (``JoinClients.written_since``) against the real broker: it finds every example of the
partitions it restores written past their ends, and ends while another worker goes on writing the examples of
its own partitions into the same log (a restored partition does not wait for the others' workers to pause)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from streamrec.ingest import TopicSpec, ensure_topics
from streamrec.ingest.faust_worker import Cluster
from streamrec.joiner.join_clients import ID_HEADER, JoinClients

pytestmark = [pytest.mark.broker]


def _producer(bootstrap: str):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)


def _send(prod, topic: str, source: int, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        prod.send(topic, b"{}", partition=i % 2, headers=[(ID_HEADER, f"{source}|r{i}|negative|".encode())])
    prod.flush()


def test_the_scan_finds_its_partitions_examples_and_ends_while_another_worker_writes(bootstrap, topics):
    topic = f"scan-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [TopicSpec(topic, 2)])
    prod = _producer(bootstrap)
    _send(prod, topic, 1, 200)  # the other worker's partition 1, before the ends below
    clients = JoinClients(Cluster.of(bootstrap, topics.kafka), topic)
    stop, writing = threading.Event(), threading.Event()

    def other_worker():  # partition 1's worker goes on writing all along, a few records every few ms
        other, i = _producer(bootstrap), 1000
        while not stop.is_set():
            _send(other, topic, 1, 20, start=i)
            writing.set()
            i += 20
            time.sleep(0.005)
        other.close()

    async def scan():
        await clients.start()
        try:
            ends = await clients.output_ends()
            _send(prod, topic, 0, 50)  # partition 0's examples past its recorded ends (a run cut short)
            try:
                return await asyncio.wait_for(clients.written_since({0: ends}), 20)
            except asyncio.TimeoutError:
                raise AssertionError("the scan did not end in 20 s while another worker wrote its own "
                                     "partition's examples: it waited for them to stop") from None
        finally:
            await clients.stop()

    t = threading.Thread(target=other_worker, daemon=True)
    t.start()
    try:
        assert writing.wait(30)
        got = asyncio.run(scan())
    finally:
        stop.set()
        t.join(30)
        prod.close()
    assert got == {0: {f"0|r{i}|negative|" for i in range(50)}}
