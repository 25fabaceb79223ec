"""The C record parser hook (ingest/fast_records.py) yields exactly kafka-python's records.

Real broker, real fetches: the same topic is read by two kafka-python consumers, one
with the hook, one without, and every ConsumerRecord field must match. Then the
fallback cases with hand-built record batches (CRC damage, the old message format).
Each for both forms of the hook: a ConsumerRecord per record, and one RecordRun per
fetch (what EventConsumer uses), whose records must be the same ConsumerRecords.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import CorruptRecordError

from streamrec.ingest import EventConsumer, EventSchema, fast_records
from streamrec.ingest.broker import TopicSpec, ensure_topics


def _topic(bootstrap, partitions=2, configs=None) -> str:
    name = f"fast-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                      topic_configs=configs or {})])
    finally:
        admin.close()
    ensure_topics(bootstrap, [TopicSpec(name, partitions)])  # waits until the topic is visible
    return name


def _produce(bootstrap, topic, n, partitions=2, **producer_opts):
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20, **producer_opts)
    for i in range(n):
        key = None if i % 3 == 0 and i % 97 != 5 else f"k{i}".encode()
        value = None if i % 97 == 5 else (b'{"ts": %d, "label": 1, "sparse": {"user": %d}}' % (i, i))
        headers = [("h", b"x" * (i % 4)), ("empty", b"")] if i % 5 == 0 else None
        p.send(topic, value=value, key=key, headers=headers, partition=i % partitions)
    p.flush(60)
    p.close()


def _flat(items) -> list:
    """ConsumerRecords, from records or from RecordRuns (the runs form of the hook)."""
    out = []
    for x in items:
        if isinstance(x, fast_records.RecordRun):
            assert len(x) > 0
            out.extend(x.records())
        else:
            out.append(x)
    return out


def _read(bootstrap, topic, n, fast, partitions=2, start=None, **opts) -> list:
    """fast: False (kafka-python), True (the hook, records) or "runs" (the hook, RecordRuns)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", max_poll_records=500, **opts)
    try:
        if fast:
            assert fast_records.install(c, runs=fast == "runs")
            assert fast_records.installed(c)
        else:
            assert not fast_records.installed(c)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, (start or {}).get(tp.partition, 0))
        out = []
        empty = 0
        # until n records, or (fewer there: a read from `start`, or a broker that leaves out aborted
        # transactions) until a poll comes back empty with every partition read to its end offset;
        # 10 s of empty polls is the last resort
        while len(out) < n and empty < 40:
            got = c.poll(timeout_ms=250)
            empty = 0 if got else empty + 1
            if empty and all(c.position(tp) >= end for tp, end in c.end_offsets(tps).items()):
                break
            for recs in got.values():
                assert all(isinstance(r, fast_records.RecordRun) for r in recs) == (fast == "runs")
                out.extend(_flat(recs))
        positions = {tp.partition: c.position(tp) for tp in tps}
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset)), positions


@pytest.mark.parametrize("form", [True, "runs"])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_same_records_as_kafka_python(bootstrap, compression, form):
    topic = _topic(bootstrap)
    n = 6000  # large batches: thousands of records per batch at linger 50 ms
    _produce(bootstrap, topic, n, compression_type=compression)
    fast, fast_pos = _read(bootstrap, topic, n, fast=form)
    slow, slow_pos = _read(bootstrap, topic, n, fast=False)
    assert len(slow) == n
    assert fast == slow  # every field: offsets, timestamps, keys, values (None too), headers, sizes, epoch
    assert [tuple(map(type, r)) for r in fast] == [tuple(map(type, r)) for r in slow]  # bytes, not views
    assert fast_pos == slow_pos == {0: n // 2, 1: n // 2}
    assert any(r.headers for r in fast) and any(r.value is None for r in fast) and any(r.key is None for r in fast)
    # from the middle of a batch: the records before the fetch offset are dropped, as kafka-python does
    start = {0: 1234, 1: 7}
    fast, _ = _read(bootstrap, topic, n, fast=form, start=start)
    slow, _ = _read(bootstrap, topic, n, fast=False, start=start)
    assert fast == slow and fast[0].offset == 1234 and len(fast) == n - 1234 - 7


@pytest.mark.parametrize("runs", [False, True])
def test_log_append_time(runs):
    """A batch stamped by the broker (LogAppendTime): every record carries the batch's max timestamp.
    (The embedded broker does not stamp batches, so the batch is made here: attribute bit, CRC redone.)"""
    import struct

    from kafka.consumer.fetcher import Fetcher
    from kafka.record.util import calc_crc32c

    data = bytearray(_batches((2, 0, [b"a", b"b", b"c"])))
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x08)  # timestamp type: append
    struct.pack_into(">q", data, 35, 1_800_000_000_000)  # max timestamp: the broker's append time
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    fast = _take_all(fast_records.fast_partition_records(runs), bytes(data))
    slow = _take_all(Fetcher.PartitionRecords, bytes(data))
    assert fast == slow and len(fast[0]) == 3 and fast[1] is None
    assert {(r.timestamp_type, r.timestamp) for r in fast[0]} == {(1, 1_800_000_000_000)}


@pytest.mark.parametrize("form", [True, "runs"])
def test_control_batches_of_transactions(bootstrap, form):
    """Transactional batches and their commit/abort markers (control batches, never returned)."""
    import confluent_kafka as ck  # a test dependency (pyproject's test extra)

    topic = _topic(bootstrap, partitions=1)
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "log_level": 3})
    p.init_transactions(30)
    for commit in (True, False, True):
        p.begin_transaction()
        for i in range(50):
            p.produce(topic, value=b"v%d" % i, partition=0)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    p.flush(30)
    del p
    fast, fast_pos = _read(bootstrap, topic, 150, fast=form, partitions=1)
    slow, slow_pos = _read(bootstrap, topic, 150, fast=False, partitions=1)
    # read_uncommitted; the embedded broker returns the two committed transactions here (Apache Kafka
    # returns the aborted one too): what matters is the same records, never a control record
    assert len(slow) >= 100 and {r.value for r in slow} == {b"v%d" % i for i in range(50)}
    assert fast == slow
    assert fast_pos == slow_pos and fast_pos[0] > slow[-1].offset + 1  # past the control record(s)


def _batches(*specs) -> bytes:
    """Record batches built by kafka-python's builder: (magic, base offset, values) each."""
    from kafka.record import MemoryRecordsBuilder

    out = b""
    for magic, base, values in specs:
        b = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1 << 20, offset=base)
        for i, v in enumerate(values):
            b.append(timestamp=1_700_000_000_000 + i, key=None, value=v, headers=[] if magic == 2 else None)
        b.close()
        out += bytes(b.buffer())
    return out


def _take_all(cls, data, fetch_offset=0):
    from kafka.record import MemoryRecords

    part = cls(fetch_offset, TopicPartition("t", 0), MemoryRecords(data))
    got, error = [], None
    while part:  # as the Fetcher does: take until drained
        try:
            got.extend(_flat(part.take(3)))
        except CorruptRecordError as e:
            error = e
            break
    return got, error, part.next_fetch_offset


@pytest.mark.parametrize("runs", [False, True])
def test_crc_damage_falls_back_to_kafka_python(caplog, monkeypatch, runs):
    from kafka.consumer.fetcher import Fetcher

    monkeypatch.setattr(fast_records, "_warned", set())  # warned once per process: again for this test
    fast_cls = fast_records.fast_partition_records(runs)
    good = _batches((2, 0, [b"a", b"b", b"c", b"d"]))
    bad = bytearray(_batches((2, 4, [b"e", b"f"])))
    bad[-1] ^= 0xFF  # a value byte: the batch CRC no longer matches
    data = good + bytes(bad)
    with caplog.at_level(logging.WARNING, logger="streamrec.ingest.fast_records"):
        fast = _take_all(fast_cls, data)
    slow = _take_all(Fetcher.PartitionRecords, data)
    assert [r.value for r in fast[0]] == [r.value for r in slow[0]] == [b"a", b"b", b"c", b"d"]
    assert fast[0] == slow[0]
    assert isinstance(fast[1], CorruptRecordError) and isinstance(slow[1], CorruptRecordError)
    assert str(fast[1]) == str(slow[1])
    assert "CRC" in caplog.text


@pytest.mark.parametrize("runs", [False, True])
def test_old_message_format_falls_back(runs):
    from kafka.consumer.fetcher import Fetcher

    data = _batches((1, 0, [b"x", b"y"]), (2, 2, [b"z"]))
    fast = _take_all(fast_records.fast_partition_records(runs), data)
    slow = _take_all(Fetcher.PartitionRecords, data)
    assert fast == slow and [r.value for r in fast[0]] == [b"x", b"y", b"z"] and fast[1] is None


def test_untested_kafka_python_version_stays_on_kafka_python(monkeypatch, bootstrap):
    import kafka

    monkeypatch.setattr(kafka, "__version__", "99.0.0")
    for name, value in (("_loaded", False), ("_warned", set()), ("_CLASS", None), ("_WHY_NOT", None)):
        monkeypatch.setattr(fast_records, name, value)  # restored after the test
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        assert not fast_records.install(c)
        assert not fast_records.installed(c)
        assert "99.0.0" in fast_records._WHY_NOT
    finally:
        c.close()


def test_event_consumer_switch(bootstrap, topics):
    """kafka.fast_records on (the default) and off: the same decoded events and offsets."""
    import numpy as np

    from streamrec.ingest import EventProducer, SyntheticStream
    from tests.helpers.ingest import poll_events

    sent = list(SyntheticStream(topics).batches(3000))
    prod = EventProducer(bootstrap, topics.kafka, EventSchema.from_sections(topics.model, topics.ingest), codec="json")
    for b in sent:
        prod.send_batch(b)
    prod.close()
    on = EventConsumer(bootstrap, topics.kafka, topics.ingest, EventSchema.from_sections(topics.model, topics.ingest),
                       "g-on", mode="assign", dlq=False)
    topics.kafka.fast_records = False
    off = EventConsumer(bootstrap, topics.kafka, topics.ingest, EventSchema.from_sections(topics.model, topics.ingest),
                        "g-off", mode="assign", dlq=False)
    try:
        assert on.fast_records and fast_records.installed(on.consumer)
        assert not off.fast_records and not fast_records.installed(off.consumer)
        got = {}
        for name, c in (("on", on), ("off", off)):
            batches = poll_events(c, 3000)
            got[name] = (sorted(np.concatenate([b.ts for b in batches]).tolist()),
                         sorted(np.concatenate([b.labels for b in batches]).tolist()),
                         dict(c._next), c.stats.records, c.stats.dead_letters)
        assert got["on"][3] == 3000 and got["on"][4] == 0
        assert got["on"] == got["off"]
    finally:
        on.close()
        off.close()


def test_record_runs_split_and_join_keep_records_and_epochs():
    """A run's records (as ConsumerRecords) survive splitting at any point and joining with the next
    fetch's run, leader epochs included (a batch of a new epoch starts a new entry)."""
    from streamrec.ingest.inflight import ranges_of
    from streamrec.ingest.kafka_io import _merge_runs

    data = _batches((2, 0, [b"a", b"b", b"c"]), (2, 3, [b"d", b"e"]))
    import struct

    from kafka.record.util import calc_crc32c

    data = bytearray(data)
    second = 61 + struct.unpack_from(">i", data, 8)[0] + 12 - 61  # the second batch's start
    struct.pack_into(">i", data, second + 12, 7)  # its partition leader epoch: 7
    struct.pack_into(">I", data, second + 17, calc_crc32c(bytes(data[second + 21:])))
    want = _take_all(fast_records.fast_partition_records(), bytes(data))[0]
    runs = _take_all(fast_records.fast_partition_records(True), bytes(data))[0]
    assert want == runs and [r.leader_epoch for r in want] == [0, 0, 0, 7, 7]
    cls = fast_records.fast_partition_records(True)
    from kafka.record import MemoryRecords

    (run,) = cls(0, TopicPartition("t", 0), MemoryRecords(bytes(data))).take(10)
    for k in range(len(run) + 1):
        head, tail = run.split(k)
        assert len(head) == k and head.records() + tail.records() == want
        assert head.values() + tail.values() == [b"a", b"b", b"c", b"d", b"e"]
        joined = _merge_runs([x for x in (head, tail) if len(x)])
        assert len(joined) == 1 and joined[0].records() == want
    other = cls(0, TopicPartition("t", 0), MemoryRecords(bytes(data))).take(10)[0]
    two = _merge_runs([run.split(1)[1], other.split(2)[0]])  # two fetches' runs of one partition
    assert len(two) == 1 and two[0].records() == want[1:] + want[:2]
    assert [(r.first, r.last) for r in ranges_of([run.split(1)[1]])] == [(1, 4)]
