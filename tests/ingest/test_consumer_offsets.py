"""The consumer's offsets: they are committed only when the caller marks a position durable (a
consumer stopped before that re-reads the same events, one started after it reads only what is
new), and a consumer group's new member starts over when nothing was marked durable."""

from __future__ import annotations

import time

import pytest

from streamrec.ingest import EventConsumer, EventProducer, EventSchema, SyntheticStream
from tests.helpers.ingest import consume_all, events_of, poll_events

pytestmark = pytest.mark.broker


def _send_synthetic(bootstrap, cfg, n):
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec="json")
    for b in SyntheticStream(cfg).batches(n):
        p.send_batch(b)
    p.close()


def test_offsets_commit_only_when_durable(topics, bootstrap):
    cfg = topics
    _send_synthetic(bootstrap, cfg, 300)
    group = cfg.kafka.trainer_group

    def first_batch():
        c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest), group, mode="assign")
        return c, poll_events(c, 300, timeout=15, max_events=1000)

    c1, got1 = first_batch()
    assert sum(len(b) for b in got1) == 300
    c1.close()  # stopped without mark_durable
    c2, got2 = first_batch()
    assert events_of(got2) == events_of(got1)  # the same events again
    offsets = {}
    for b in got2:
        for k, v in b.source_offsets.items():
            offsets[k] = max(offsets.get(k, 0), v)
    c2.mark_durable(offsets)
    assert {k: v for k, v in c2.committed().items() if v is not None} == offsets
    c2.close()
    c3 = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest), group, mode="assign")
    try:
        assert c3.poll_batch(1000, timeout=2.0) is None  # nothing new after the durable mark
        _send_synthetic(bootstrap, cfg, 10)
        deadline = time.monotonic() + 10
        fresh = []  # the 10 new events may arrive over several polls
        while sum(len(b) for b in fresh) < 10 and time.monotonic() < deadline:
            b = c3.poll_batch(1000, timeout=0.5)
            if b is not None:
                fresh.append(b)
        assert sum(len(b) for b in fresh) == 10
        for b in fresh:  # read from past the durable mark, not from the start again
            assert all(o > offsets.get(k, 0) for k, o in b.source_offsets.items())
    finally:
        c3.close()


def test_group_mode_joins_and_resumes(topics, bootstrap):
    cfg = topics
    cfg.kafka.max_poll_interval_ms = 3000  # also the rebalance timeout: keeps the join short
    _send_synthetic(bootstrap, cfg, 200)
    batches, _ = consume_all(bootstrap, cfg, 200, mode="group", group=cfg.kafka.trainer_group, timeout=60)
    assert sum(len(b) for b in batches) == 200
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      cfg.kafka.trainer_group, mode="group")
    try:  # nothing was marked durable: a new member of the group starts over
        got = poll_events(c, 200, timeout=60, max_events=1000)
        assert events_of(got) == events_of(batches)
        assert len(c.consumer.assignment()) == cfg.kafka.partitions
    finally:
        c.close()


def test_a_poll_hands_over_about_what_was_asked_even_before_it_knows_the_records_size(topics, bootstrap):
    """Arrow records of 512 events each, a backlog of 40: every poll, the first included, returns at most
    the events asked for plus one record's (a poll counts records; until it has decoded one it cannot know
    how many events a record holds, and must not hand over the backlog in one piece)."""
    cfg = topics
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec="arrow")
    for b in SyntheticStream(cfg).batches(40 * 512):
        p.send_batch(b)
    p.close()
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      cfg.kafka.trainer_group, mode="assign")
    try:
        sizes, deadline = [], time.monotonic() + 30
        while sum(sizes) < 40 * 512 and time.monotonic() < deadline:
            b = c.poll_batch(1024, timeout=0.5)
            if b is not None:
                sizes.append(len(b))
        assert sum(sizes) == 40 * 512
        assert max(sizes) <= 1024 + 512, sizes
    finally:
        c.close()


def test_fetch_behind_holds_while_fetched_records_remain_and_not_after_a_transactions_marker(topics, bootstrap):
    """``fetch_behind`` (what keeps a trainer's idle clock from running): False once every record is fetched,
    True after a seek back while a fetch's high watermark shows records no fetch brought yet, and False
    again at the end of a topic whose last record is a transaction's commit marker (nothing to wait for);
    ``partitions_behind`` (what the trainer's merge waits for) names no partition there either."""
    from kafka import KafkaProducer, TopicPartition

    from streamrec.ingest import TopicSpec, ensure_topics

    cfg = topics
    _send_synthetic(bootstrap, cfg, 2000)
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      cfg.kafka.trainer_group, mode="assign")
    try:
        assert sum(len(b) for b in poll_events(c, 2000, timeout=20, max_events=5000)) == 2000
        assert c.poll_batch(1000, timeout=0.5) is None and not c.fetch_behind()
        start = {(cfg.kafka.events_topic, p): 0 for p in range(cfg.kafka.partitions)}
        c.reader.set_positions(start)  # back to the start: the high watermarks say records wait unfetched
        assert c.fetch_behind() and c.partitions_behind()
    finally:
        c.close()

    topic = cfg.kafka.events_topic + "-tx"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    prod = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}")
    prod.init_transactions()
    prod.begin_transaction()
    for i in range(5):
        prod.send(topic, b"x", partition=0)
    prod.commit_transaction()
    prod.close()
    kafka = cfg.kafka.__class__(**{**vars(cfg.kafka), "events_topic": topic, "partitions": 1})
    c = EventConsumer(bootstrap, kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      cfg.kafka.trainer_group + "-tx", mode="assign")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            c.poll_batch(1000, timeout=0.5)  # the five records are malformed events: dead letters
            if c.reader.kc.highwater(TopicPartition(topic, 0)) == 6 and not c.fetch_behind():
                break
        assert c.reader.kc.highwater(TopicPartition(topic, 0)) == 6  # five records and the commit marker
        assert not c.fetch_behind()
        assert c.partitions_behind() == set()  # the trainer's merge holds no other partition for the marker
    finally:
        c.close()
