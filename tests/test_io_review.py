"""Input/output review: bad input that crashed a part, or was silently accepted or altered.

Each test reproduced a defect before its fix (see the git log for the commit that fixed it).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from ingest import REASON_HEADER, Decoder, EventConsumer, EventProducer, EventSchema, read_topic


def _good(ts=1):
    return {"ts": ts, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "tags": ["a", 2]}}


# records that used to raise out of Decoder.decode_many (stopping the consumer) instead of becoming dead letters
CRASHERS = {
    "ts beyond int64": json.dumps({**_good(), "ts": 2**63}).encode(),
}


def test_records_that_crashed_the_decoder_are_dead_lettered(cfg):
    dec = Decoder(EventSchema.from_config(cfg))
    values = [json.dumps(_good(0)).encode()]
    for raw in CRASHERS.values():
        values += [raw, json.dumps(_good(len(values) + 1)).encode()]
    batch, errors = dec.decode_many(values)
    assert [i for i, _ in errors] == list(range(1, len(values), 2))
    assert [int(t) for t in batch.ts] == list(range(0, len(values), 2))
    reasons = dict(zip(CRASHERS, (r for _, r in errors)))
    assert "ts must be an integer" in reasons["ts beyond int64"] and "int64" in reasons["ts beyond int64"]


@pytest.mark.broker
def test_crashing_records_reach_the_dlq_through_the_broker(topics, bootstrap):
    """The consumer keeps going: good records arrive, each bad one is in the DLQ with its bytes and reason."""
    cfg = topics
    p = EventProducer(bootstrap, cfg)
    for i, raw in enumerate(CRASHERS.values()):
        p.send_raw(raw, key=str(i).encode())
        p.send_raw(json.dumps(_good(100 + i)).encode())
    p.close()
    c = EventConsumer(bootstrap, cfg, f"g-{uuid.uuid4().hex[:6]}", mode="assign")
    got = 0
    deadline = time.monotonic() + 20
    try:
        while got < len(CRASHERS) and time.monotonic() < deadline:
            b = c.poll_batch(1000, timeout=0.5)
            got += len(b) if b is not None else 0
        c.mark_durable({})
    finally:
        c.close()
    assert got == len(CRASHERS)
    dlq = {int(r.key): r for r in read_topic(bootstrap, cfg.kafka.dlq_topic, timeout=15, expected=len(CRASHERS))}
    assert sorted(dlq) == list(range(len(CRASHERS)))
    for i, raw in enumerate(CRASHERS.values()):
        assert dlq[i].value == raw
        assert dict(dlq[i].headers)[REASON_HEADER]
