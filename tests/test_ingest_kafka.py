"""Events through the real embedded broker: codecs, a third-party producer, dead letters, offsets, `produce`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from streamrec.ingest import (
    REASON_HEADER, SOURCE_HEADER, EventConsumer, EventProducer, EventSchema, SyntheticStream, encode_arrow,
    ensure_topics, hash_id, pipeline_topics, read_topic, write_events,
)
from streamrec.app.cli import main as streamrec_main
from tests.conftest import small_config

pytestmark = pytest.mark.broker


def consume_all(bootstrap, cfg, expected_events, mode="assign", group=None, timeout=20.0, **opts):
    """Read until ``expected_events`` arrived (or timeout); returns (batches, consumer stats)."""
    c = EventConsumer(bootstrap, cfg, group or f"g-{uuid.uuid4().hex[:6]}", mode=mode, **opts)
    batches = []
    deadline = time.monotonic() + timeout
    try:
        while sum(len(b) for b in batches) < expected_events and time.monotonic() < deadline:
            b = c.poll_batch(4096, timeout=0.5)
            if b is not None:
                batches.append(b)
        c.mark_durable({})  # flush dead letters
        return batches, c.stats
    finally:
        c.close()


def events_of(batches):
    """Events in a canonical order (partitions interleave), for comparisons."""
    evs = [ev for b in batches for ev in b.to_events()]
    return sorted(evs, key=lambda e: json.dumps(e, sort_keys=True))


def hand_events(dense_dim):
    return [
        {"ts": 1, "label": 1, "dense": [0.5] * dense_dim, "sparse": {"user": "alice", "item": 7, "tags": [1, "x", 3]}},
        {"ts": 2, "label": 0.0, "dense": [1.0] * dense_dim, "sparse": {"user": 2**63 - 1, "item": "book"}},
        {"ts": 3, "label": 0, "dense": [-2] * dense_dim, "user": "bob", "sparse": {"tags": []}},
        {"ts": 4, "label": 1, "dense": [0] * dense_dim, "sparse": {"item": -5, "tags": ["a", "b"]}, "request_id": "r4"},
    ]


def expected_events(evs, fields):
    out = []
    for ev in evs:
        sp = dict(ev.get("sparse", {}))
        if "user" in ev:
            sp.setdefault("user", ev["user"])
        e = {"ts": ev["ts"], "label": float(ev["label"]), "dense": [float(x) for x in ev["dense"]],
             "sparse": {f: [hash_id(x) for x in (sp.get(f, []) if isinstance(sp.get(f, []), list) else [sp[f]])]
                        for f in fields}}
        if "request_id" in ev:
            e["request_id"] = ev["request_id"]
        out.append(e)
    return sorted(out, key=lambda e: json.dumps(e, sort_keys=True))


@pytest.mark.parametrize("codec", ["json", "arrow"])
@pytest.mark.parametrize("dense_dim", [3, 0])
def test_round_trip_through_broker(bootstrap, tmp_path, codec, dense_dim):
    cfg = small_config(tmp_path, **{"model.dense_dim": dense_dim})
    sfx = uuid.uuid4().hex[:8]
    cfg.kafka.events_topic, cfg.kafka.dlq_topic = f"rt-{sfx}", f"rt-{sfx}.dlq"
    cfg.kafka.events_per_message = 100
    ensure_topics(bootstrap, pipeline_topics(cfg))
    schema = EventSchema.from_config(cfg)
    hand = schema.batch_from_events(hand_events(dense_dim))
    synth = list(SyntheticStream(cfg, chunk=250).batches(500))
    p = EventProducer(bootstrap, cfg, codec=codec)
    for b in [hand, *synth]:
        p.send_batch(b)
    p.close()
    assert p.sent_messages == (504 if codec == "json" else 1 + 6)
    batches, stats = consume_all(bootstrap, cfg, 504)
    assert stats.dead_letters == 0
    assert events_of(batches) == events_of([hand, *synth])
    # the hand-written events decode to exactly what the contract says (string ids hashed, lists kept)
    got_hand = [e for e in events_of(batches) if e["ts"] in (1, 2, 3, 4)]
    assert got_hand == expected_events(hand_events(dense_dim), cfg.model.field_names)
    assert all(b.dense.shape[1] == dense_dim for b in batches)


def test_third_party_producer_decodes_like_ours(topics, bootstrap):
    from confluent_kafka import Producer

    cfg = topics
    evs = hand_events(cfg.model.dense_dim) * 5
    prod = Producer({"bootstrap.servers": bootstrap, "api.version.request": True})
    for ev in evs:
        prod.produce(cfg.kafka.events_topic, json.dumps(ev).encode())
    assert prod.flush(30) == 0
    ours = EventProducer(bootstrap, cfg, codec="json")
    for ev in evs:
        ours.send_raw(json.dumps(ev, separators=(",", ":")).encode())
    ours.close()
    batches, stats = consume_all(bootstrap, cfg, 2 * len(evs))
    assert stats.dead_letters == 0 and stats.records == 2 * len(evs)
    got = events_of(batches)
    # every event arrived twice (once per producer) and both copies decode identically
    assert got[0::2] == got[1::2]
    assert got[0::2] == expected_events(evs, cfg.model.field_names)


def test_every_bad_record_goes_to_the_dlq(topics, bootstrap):
    cfg = topics
    schema = EventSchema.from_config(cfg)
    good = {"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"user": 1}}
    arrow = encode_arrow(schema.batch_from_events([good] * 3), schema)
    bad = {
        "bad JSON": b'{"label": 1, ',
        "wrong types": json.dumps({**good, "ts": "yesterday"}).encode(),
        "wrong id type": json.dumps({**good, "sparse": {"user": 1.5}}).encode(),
        "missing label": json.dumps({k: v for k, v in good.items() if k != "label"}).encode(),
        "wrong dense width": json.dumps({**good, "dense": [1, 2]}).encode(),
        "unknown field": json.dumps({**good, "sparse": {"colour": 3}}).encode(),
        "unknown key": json.dumps({**good, "extra": 3}).encode(),
        "garbage": b"\x00\x01\x02garbage",
        "truncated Arrow": arrow[: len(arrow) // 2],
        "empty": b"",
    }
    p = EventProducer(bootstrap, cfg)
    sent_good = 0
    for i, raw in enumerate(bad.values()):
        p.send_raw(json.dumps({**good, "ts": 100 + i}).encode())
        p.send_raw(raw, key=str(i).encode())
        sent_good += 1
    p.send_raw(arrow)
    sent_good += 3
    p.close()
    batches, stats = consume_all(bootstrap, cfg, sent_good)
    time.sleep(0.5)  # the consumer polls a little more; nothing else must arrive
    assert sum(len(b) for b in batches) == sent_good
    assert stats.dead_letters == len(bad)
    assert stats.records == len(bad) * 2 + 1
    dlq = read_topic(bootstrap, cfg.kafka.dlq_topic, timeout=15, expected=len(bad))
    assert len(dlq) == len(bad)
    by_key = {int(r.key): r for r in dlq}
    for i, (kind, raw) in enumerate(bad.items()):
        rec = by_key[i]
        headers = dict(rec.headers)
        assert (rec.value or b"") == raw, kind  # original bytes kept
        assert headers[SOURCE_HEADER].decode().startswith(cfg.kafka.events_topic + ":")
        assert headers[REASON_HEADER], kind
    reasons = {kind: dict(by_key[i].headers)[REASON_HEADER].decode() for i, kind in enumerate(bad)}
    assert reasons["bad JSON"].startswith("bad JSON")
    assert "ts must be an integer" in reasons["wrong types"]
    assert "sparse field 'user'" in reasons["wrong id type"]
    assert reasons["missing label"] == "missing label"
    assert "dense has 2 values, the model expects 3" in reasons["wrong dense width"]
    assert "unknown sparse field 'colour'" in reasons["unknown field"]
    assert "unknown key 'extra'" in reasons["unknown key"]
    assert "neither a JSON object nor an Arrow" in reasons["garbage"]
    assert "bad Arrow IPC stream" in reasons["truncated Arrow"]
    assert reasons["empty"] == "empty message"


def test_a_dead_letter_the_dlq_refuses_stops_progress_with_a_clear_error(topics, bootstrap):
    """A bad record whose dead letter is not acknowledged exists only in the source topic:
    the consumer says so at the next flush (before a checkpoint or commit) instead of
    crashing in poll or losing it silently."""
    from streamrec.ingest import DeadLetterError, make_producer

    cfg = topics
    good = {"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"user": 1}}
    p = EventProducer(bootstrap, cfg)
    p.send_raw(json.dumps(good).encode())
    p.send_raw(b"x" * 500)  # bad, and too big for the DLQ producer below
    p.close()
    c = EventConsumer(bootstrap, cfg, f"g-{uuid.uuid4().hex[:6]}", mode="assign")
    try:
        c._dlq.close()
        c._dlq = make_producer(bootstrap, max_request_size=256)  # a real producer the record cannot pass
        got, deadline = 0, time.monotonic() + 20
        while c.stats.dead_letters < 1 and time.monotonic() < deadline:
            b = c.poll_batch(4096, timeout=0.5)
            got += len(b) if b is not None else 0
        assert got == 1 and c.stats.dead_letters == 1  # the good event still arrived
        with pytest.raises(DeadLetterError, match=rf"{cfg.kafka.events_topic}:\d+:\d+: .*MessageSizeTooLarge"):
            c.mark_durable({})
    finally:
        c._dlq_sent.clear()
        c.close()


def _send_synthetic(bootstrap, cfg, n):
    p = EventProducer(bootstrap, cfg, codec="json")
    for b in SyntheticStream(cfg).batches(n):
        p.send_batch(b)
    p.close()


def test_offsets_commit_only_when_durable(topics, bootstrap):
    cfg = topics
    _send_synthetic(bootstrap, cfg, 300)
    group = cfg.kafka.trainer_group

    def first_batch():
        c = EventConsumer(bootstrap, cfg, group, mode="assign")
        got = []
        deadline = time.monotonic() + 15
        while sum(len(b) for b in got) < 300 and time.monotonic() < deadline:
            b = c.poll_batch(1000, timeout=0.5)
            if b is not None:
                got.append(b)
        return c, got

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
    c3 = EventConsumer(bootstrap, cfg, group, mode="assign")
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
    c = EventConsumer(bootstrap, cfg, cfg.kafka.trainer_group, mode="group")
    try:  # nothing was marked durable: a new member of the group starts over
        got = []
        deadline = time.monotonic() + 60
        while sum(len(b) for b in got) < 200 and time.monotonic() < deadline:
            b = c.poll_batch(1000, timeout=0.5)
            if b is not None:
                got.append(b)
        assert events_of(got) == events_of(batches)
        assert len(c.consumer.assignment()) == cfg.kafka.partitions
    finally:
        c.close()


def test_produce_command_replays_a_file(topics, bootstrap, tmp_path, capsys):
    cfg = topics
    path = tmp_path / "ev.parquet"
    write_events(path, SyntheticStream(cfg).batches(3000), cfg)
    args = ["produce", str(path), "--bootstrap", bootstrap, "--codec", "arrow", "-q", "--limit", "2500",
            "--set", f"kafka.events_topic={cfg.kafka.events_topic}", "--set", f"kafka.dlq_topic={cfg.kafka.dlq_topic}",
            "--set", f"kafka.hotset_topic={cfg.kafka.hotset_topic}",
            "--set", f"model.fields={json.dumps([f.__dict__ for f in cfg.model.fields])}", "--set", "model.dense_dim=3"]
    assert streamrec_main(args) == 0
    assert "produced 2,500 events" in capsys.readouterr().out
    batches, stats = consume_all(bootstrap, cfg, 2500)
    assert sum(len(b) for b in batches) == 2500 and stats.dead_letters == 0
    expected = next(SyntheticStream(cfg).batches(2500))
    assert events_of(batches) == events_of([expected])


def test_produce_ctrl_c_stops_cleanly(topics, bootstrap, tmp_path):
    cfg = topics
    cmd = [sys.executable, "-m", "streamrec", "produce", "--synthetic", "100000", "--rate", "500", "-q",
           "--bootstrap", bootstrap, "--set", f"kafka.events_topic={cfg.kafka.events_topic}",
           "--set", f"kafka.dlq_topic={cfg.kafka.dlq_topic}", "--set", f"kafka.hotset_topic={cfg.kafka.hotset_topic}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        deadline = time.monotonic() + 60  # start-up imports can be slow on a busy machine
        while time.monotonic() < deadline and proc.poll() is None and not read_topic(
                bootstrap, cfg.kafka.events_topic, timeout=0.5):
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert out.startswith("interrupted: produced "), (out, err)
    sent = int(out.split()[2].replace(",", ""))
    assert 0 < sent < 100000
    records = read_topic(bootstrap, cfg.kafka.events_topic, timeout=15)
    full = load_default_cfg()
    from streamrec.ingest import Decoder

    dec = Decoder(EventSchema.from_config(full))
    assert sum(len(dec.decode(r.value)) for r in records) == sent  # everything reported sent is in the topic


def load_default_cfg():
    from streamrec.foundation import load_config

    return load_config(None, {}, env={})
