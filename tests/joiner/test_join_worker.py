"""`streamrec join` as a process against the real embedded broker (faust, RocksDB tables): the labelled
events it writes equal the oracle's for every request_id, malformed records go to the DLQ with a reason, and
topics that are not co-partitioned are refused at start-up in one line."""

from __future__ import annotations

import json
import time
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from streamrec.ingest import TopicSpec, ensure_topics
from streamrec.joiner import FEEDBACK_HEADER, JoinRules
from tests.helpers.waiting import wait_until
from tests.joiner.test_join_oracle import make_streams, oracle
from tests.sketch.test_sketch_worker import stop, write_config

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

STREAMREC = str(Path(sys.executable).with_name("streamrec"))
P = 2


def joined_streams(bootstrap, cfg, seed: int, partitions: int = P, **kw) -> tuple[JoinRules, dict, dict, Counter]:
    """The join's two topics created, ``partitions`` each; its rules, seeded impressions and actions per
    partition (``make_streams(seed, partitions, **kw)``) and the examples the oracle says the join writes for
    them."""
    ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, partitions),
                              TopicSpec(cfg.join.actions_topic, partitions)])
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(seed, partitions, **kw)
    want: Counter = Counter()
    for p in range(partitions):
        want += oracle(r, imps[p], acts[p])
    return r, imps, acts, want


def join_config(cfg, mode: str):
    s = uuid.uuid4().hex[:8]
    cfg.join.impressions_topic, cfg.join.actions_topic = f"imp-{s}", f"act-{s}"
    cfg.join.group = f"join-{s}"
    cfg.join.mode = mode
    cfg.join.window_s, cfg.join.allowed_lateness_s, cfg.join.orphan_wait_s = 0.1, 0.02, 0.05  # the oracle's W, L, O
    cfg.kafka.codec = "json"
    cfg.kafka.partitions = P
    return cfg


def produce(bootstrap, cfg, imps, acts, bad=()) -> None:
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=bootstrap)
    for p in imps:
        for rid, ts, ev in imps[p]:
            ev = {"ts": ts, "dense": [0.5, 0.25, 1.0], "sparse": {"user": ev["sparse"]["user"]}, "request_id": rid}
            prod.send(cfg.join.impressions_topic, json.dumps(ev).encode(), key=rid.encode(), partition=p)
        for a in acts[p]:
            prod.send(cfg.join.actions_topic, json.dumps({"request_id": a.request_id, "ts": a.ts, "type": a.type})
                      .encode(), key=a.request_id.encode(), partition=p)
    for topic, value in bad:
        prod.send(topic, value, key=b"x", partition=0)
    prod.flush()
    prod.close()


def read_all(bootstrap, topic: str, timeout_s: float = 60.0) -> list:
    """Every record of ``topic`` up to its end offsets as they are now: read until each partition's position
    reaches its end (not until a quiet spell, which a loaded machine's slow first fetch would end early). A
    partition's end is the larger of its ListOffsets answer and the high watermark of a fetch of it: the
    embedded broker (tansu) answers ListOffsets short of the log end after batched produces (the joiner
    writes its examples in record batches)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    try:
        parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or set())]
        c.assign(parts)
        ends = c.end_offsets(parts)
        out: list = []
        deadline = time.monotonic() + timeout_s

        def unread() -> list:
            hws = {tp: c.highwater(tp) for tp in parts}  # None: no fetch of it answered yet
            return [tp for tp in parts if hws[tp] is None or c.position(tp) < max(ends[tp], hws[tp])]

        while unread():
            assert time.monotonic() < deadline, f"{topic}: not read to its ends {ends} in {timeout_s} s"
            for records in c.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        c.close()


def examples(bootstrap, cfg, r: JoinRules) -> Counter:
    got: Counter = Counter()
    for m in read_all(bootstrap, cfg.kafka.events_topic):
        ev = json.loads(m.value)
        kind = dict(m.headers)[FEEDBACK_HEADER].decode()
        assert m.key.decode() == ev["request_id"]
        got[(ev["request_id"], kind, (("click", ev["label"]),))] += 1
    return got


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
def test_worker_output_equals_the_oracle(topics, bootstrap, tmp_path, mode):
    cfg = join_config(topics, mode)
    cfg.join.state_dir = str(tmp_path / "join")
    r, imps, acts, want = joined_streams(bootstrap, cfg, 11)
    assert sum(want.values()) > 10
    bad = [(cfg.join.impressions_topic, b"not json"), (cfg.join.actions_topic, b'{"request_id": "x", "ts": "no"}'),
           (cfg.join.impressions_topic, b'{"request_id": "x", "ts": 1, "feedback": "positive"}')]
    produce(bootstrap, cfg, imps, acts, bad)
    log = tmp_path / "join.log"
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(write_config(cfg, tmp_path / "j.toml")),
                             "--bootstrap", bootstrap], stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: sum(examples(bootstrap, cfg, r).values()) >= sum(want.values()) or proc.poll() is not None,
                   120, "the joiner's examples", interval=1.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert examples(bootstrap, cfg, r) == want
        dlq = read_all(bootstrap, cfg.kafka.dlq_topic)
        reasons = sorted(dict(m.headers)["streamrec-error"].decode() for m in dlq)
        assert len(reasons) == 3 and any("not JSON" in x for x in reasons) and any("ts" in x for x in reasons)
        assert any("feedback" in x for x in reasons), reasons
    finally:
        stop(proc)


def test_topics_not_copartitioned_are_refused(topics, bootstrap, tmp_path):
    cfg = join_config(topics, "window")
    ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, 3), TopicSpec(cfg.join.actions_topic, 2)])
    cfg.join.state_dir = str(tmp_path / "join")
    out = subprocess.run([STREAMREC, "join", "--config", str(write_config(cfg, tmp_path / "j.toml")),
                          "--bootstrap", bootstrap], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    line = [x for x in out.stderr.strip().splitlines() if "co-partitioned" in x]
    assert len(line) == 1 and "3 partitions" in line[0] and "--partitions 3" in line[0], out.stderr[-2000:]


def hashed_streams(imps: dict, acts: dict) -> tuple[dict, dict]:
    """``make_streams``' records with each request_id renamed to hash (murmur2, a keyed send's partition) to
    the partition it is in, as an unkeyed Arrow record's impressions must."""
    import dataclasses

    from aiokafka.partitioner import murmur2

    def renamed(rid: str, p: int) -> str:
        return next(f"{rid}.{k}" for k in range(1000) if (murmur2(f"{rid}.{k}".encode()) & 0x7FFFFFFF) % P == p)

    names = {rid: renamed(rid, p) for p in imps for rid, _, _ in imps[p]}
    names |= {a.request_id: renamed(a.request_id, p) for p in acts for a in acts[p]}
    return ({p: [(names[rid], ts, {**ev, "request_id": names[rid]}) for rid, ts, ev in imps[p]] for p in imps},
            {p: [dataclasses.replace(a, request_id=names[a.request_id]) for a in acts[p]] for p in acts})


def test_worker_joins_arrow_impressions_as_their_json_form(topics, bootstrap, tmp_path):
    import asyncio
    import copy

    from kafka import KafkaProducer

    from streamrec.foundation import EventSchema
    from tests.joiner.join_task_fakes import EVENTS, join_all, logs_of
    from tests.joiner.test_arrow_impressions import as_arrow, written
    from tests.joiner.test_join_oracle import make_streams
    from tests.joiner.test_join_order import event_time_order

    cfg = join_config(topics, "fake_negative")
    cfg.join.window_s, cfg.join.allowed_lateness_s, cfg.join.orphan_wait_s = 1.0, 0.2, 0.5  # as test_arrow_impressions
    cfg.join.state_dir = str(tmp_path / "join")
    ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, P), TopicSpec(cfg.join.actions_topic, P)])
    imps, acts = hashed_streams(*make_streams(7, P, n=400))
    want = len(event_time_order(JoinRules.from_config(cfg.join), imps, acts))
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    logs = logs_of(cfg, imps, acts)
    in_process = copy.deepcopy(cfg)  # the same streams in JSON, joined by the join task over in-memory logs
    in_process.kafka.events_topic = EVENTS
    from_json = written(schema, asyncio.run(join_all(in_process, schema, logs, cfg.join.impressions_topic, want)))
    prod = KafkaProducer(bootstrap_servers=bootstrap)
    for topic, parts in as_arrow(cfg, logs).items():
        for p, records in parts.items():
            for key, value in records:
                prod.send(topic, value, key=key, partition=p)
    prod.flush()
    prod.close()
    log = tmp_path / "join.log"
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(write_config(cfg, tmp_path / "j.toml")),
                             "--bootstrap", bootstrap], stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        out = lambda: [(m.key, m.value, m.headers) for m in read_all(bootstrap, cfg.kafka.events_topic)]  # noqa: E731
        wait_until(lambda: len(out()) >= want or proc.poll() is not None, 120, "the joiner's examples", interval=1.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert written(schema, out()) == from_json and sum(from_json.values()) == want > 100
    finally:
        stop(proc)
