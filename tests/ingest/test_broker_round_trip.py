"""Events through the real embedded broker decode to exactly what was produced: our JSON and
Arrow codecs with and without dense features, and a third-party producer's JSON, which decodes
like ours (string ids hashed, single ids and lists alike)."""

from __future__ import annotations

import json
import uuid

import pytest

from streamrec.ingest import EventProducer, EventSchema, SyntheticStream, ensure_topics, hash_id, pipeline_topics
from tests.conftest import small_config
from tests.helpers.ingest import consume_all, events_of

pytestmark = pytest.mark.broker


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
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    hand = schema.batch_from_events(hand_events(dense_dim))
    synth = list(SyntheticStream(cfg, chunk=250).batches(500))
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec=codec)
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
    ours = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec="json")
    for ev in evs:
        ours.send_raw(json.dumps(ev, separators=(",", ":")).encode())
    ours.close()
    batches, stats = consume_all(bootstrap, cfg, 2 * len(evs))
    assert stats.dead_letters == 0 and stats.records == 2 * len(evs)
    got = events_of(batches)
    # every event arrived twice (once per producer) and both copies decode identically
    assert got[0::2] == got[1::2]
    assert got[0::2] == expected_events(evs, cfg.model.field_names)
