"""Dead letters: a record that fails to decode or validate never stops the consumer. The decoder
reports it (it never raises, whatever the bytes: ints beyond int64 or float, JSON nested 100,000
deep, Arrow columns of the wrong type), the consumer sends it to the DLQ topic with its original
bytes and the `streamrec.reason`/`streamrec.source` headers while the good records around it
arrive, and a dead letter the DLQ does not acknowledge stops progress with a clear error before
any checkpoint or commit could move past it."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from streamrec.ingest import (
    REASON_HEADER, SOURCE_HEADER, Decoder, EventConsumer, EventProducer, EventSchema, encode_arrow, read_topic,
)
from tests.helpers.ingest import arrow_ipc, consume_all


def _good(ts=1):
    return {"ts": ts, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "tags": ["a", 2]}}


def _arrow_string_dense():
    import pyarrow as pa

    return arrow_ipc({"label": pa.array([1.0], pa.float32()),
                      "dense": pa.array([["a", "b", "c"]], pa.list_(pa.string(), 3))})


# records a decoder can easily raise on (overflow, recursion, an Arrow column of the wrong type):
# each must come out of Decoder.decode_many as an error, a dead letter, not as an exception
PATHOLOGICAL = {
    "ts beyond int64": json.dumps({**_good(), "ts": 2**63}).encode(),
    "dense int beyond float": b'{"label": 1, "dense": [1' + b"0" * 400 + b', 0, 0]}',
    "deeply nested JSON": b'{"label": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "Arrow dense of strings": _arrow_string_dense(),
}


def test_pathological_records_are_dead_lettered_by_the_decoder(cfg):
    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    values = [json.dumps(_good(0)).encode()]
    for raw in PATHOLOGICAL.values():
        values += [raw, json.dumps(_good(len(values) + 1)).encode()]
    batch, errors = dec.decode_many(values)
    assert [i for i, _ in errors] == list(range(1, len(values), 2))
    assert [int(t) for t in batch.ts] == list(range(0, len(values), 2))
    reasons = dict(zip(PATHOLOGICAL, (r for _, r in errors)))
    assert "ts must be an integer" in reasons["ts beyond int64"] and "int64" in reasons["ts beyond int64"]
    assert "finite" in reasons["dense int beyond float"]
    assert "bad JSON" in reasons["deeply nested JSON"]
    assert "dense must be a list of numbers" in reasons["Arrow dense of strings"]


def test_pathological_records_reach_the_dlq_through_the_broker(topics, bootstrap):
    """The consumer keeps going: good records arrive, each bad one is in the DLQ with its bytes and reason."""
    cfg = topics
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for i, raw in enumerate(PATHOLOGICAL.values()):
        p.send_raw(raw, key=str(i).encode())
        p.send_raw(json.dumps(_good(100 + i)).encode())
    p.close()
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      f"g-{uuid.uuid4().hex[:6]}", mode="assign")
    got = 0
    deadline = time.monotonic() + 20
    try:
        while got < len(PATHOLOGICAL) and time.monotonic() < deadline:
            b = c.poll_batch(1000, timeout=0.5)
            got += len(b) if b is not None else 0
        c.mark_durable({})
    finally:
        c.close()
    assert got == len(PATHOLOGICAL)
    dlq = {int(r.key): r for r in read_topic(bootstrap, cfg.kafka.dlq_topic, timeout=15, expected=len(PATHOLOGICAL))}
    assert sorted(dlq) == list(range(len(PATHOLOGICAL)))
    for i, raw in enumerate(PATHOLOGICAL.values()):
        assert dlq[i].value == raw
        assert dict(dlq[i].headers)[REASON_HEADER]


def test_every_bad_record_goes_to_the_dlq(topics, bootstrap):
    cfg = topics
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
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
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    sent_good = 0
    for i, raw in enumerate(bad.values()):
        p.send_raw(json.dumps({**good, "ts": 100 + i}).encode())
        p.send_raw(raw, key=str(i).encode())
        sent_good += 1
    p.send_raw(arrow)
    sent_good += 3
    p.close()
    # the consumer polls on for 1 s after the good events: nothing else (no bad record as an event) arrives
    batches, stats = consume_all(bootstrap, cfg, sent_good, settle=1.0)
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
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    p.send_raw(json.dumps(good).encode())
    p.send_raw(b"x" * 500)  # bad, and too big for the DLQ producer below
    p.close()
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      f"g-{uuid.uuid4().hex[:6]}", mode="assign")
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


def test_a_bad_record_bigger_than_the_dlq_takes_is_dead_lettered_truncated_with_its_size_and_hash(topics, bootstrap):
    """The DLQ topic has its own size limit: the record goes there cut to ingest.dlq_max_bytes, and the
    headers say how big it was and what its sha256 was, so nothing is silently dropped."""
    import hashlib

    from streamrec.ingest import ORIGINAL_SHA256_HEADER, ORIGINAL_SIZE_HEADER

    cfg = topics
    cfg.ingest.dlq_max_bytes = 4096
    huge = b'{"label": 1, "ts": 1, "sparse": {"user": "' + b"x" * 50_000  # bad JSON, 50 KB
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    p.send_raw(json.dumps(_good()).encode())
    p.send_raw(huge)
    p.close()
    batches, stats = consume_all(bootstrap, cfg, 1)
    assert sum(len(b) for b in batches) == 1 and stats.dead_letters == 1
    (rec,) = read_topic(bootstrap, cfg.kafka.dlq_topic, expected=1)
    h = dict(rec.headers)
    assert rec.value == huge[:4096]
    assert int(h[ORIGINAL_SIZE_HEADER]) == len(huge)
    assert h[ORIGINAL_SHA256_HEADER].decode() == hashlib.sha256(huge).hexdigest()
    assert h[REASON_HEADER].startswith(b"bad JSON")
