"""Impressions in Arrow: one record holds many impressions (the events' Arrow columns without label), each
joined as its JSON form would be; the record is joined whole or not at all (its input offset is the
record's), and a malformed one goes to the dead letters while the join goes on."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from streamrec.foundation import EventSchema
from streamrec.ingest import Decoder, encode_arrow
from streamrec.joiner import JoinRules
from streamrec.joiner.records import Joiner
from tests.conftest import small_config
from tests.joiner.join_task_fakes import EVENTS, join_all, logs_of
from tests.joiner.test_join_oracle import make_streams
from tests.joiner.test_join_order import event_time_order

P = 2
PER_MESSAGE = 16  # impressions per Arrow record


def config(tmp_path):
    cfg = small_config(tmp_path)
    cfg.join.mode = "fake_negative"
    # a window, lateness and orphan wait longer than the event time one record's impressions span (theirs and
    # their arrival's disorder, up to 0.25 s): a record's impressions then join as they would one by one
    cfg.join.window_s, cfg.join.allowed_lateness_s, cfg.join.orphan_wait_s = 1.0, 0.2, 0.5
    cfg.join.batch_records = 100
    cfg.kafka.codec = "json"
    cfg.kafka.events_topic = EVENTS
    return cfg


def schema_of(cfg) -> EventSchema:
    return EventSchema.from_sections(cfg.model, cfg.ingest)


def arrow_records(schema: EventSchema, json_values: list[bytes], per_message: int = PER_MESSAGE) -> list:
    """JSON impression records as unkeyed Arrow records of up to ``per_message`` impressions each, in order."""
    unlabelled = Decoder(EventSchema(schema.fields, schema.dense_dim, require_label=False, tasks=schema.tasks))
    out = []
    for i in range(0, len(json_values), per_message):
        batch, errors = unlabelled.decode_many(json_values[i:i + per_message])
        assert not errors, errors
        out.append((None, encode_arrow(batch, schema, labelled=False)))
    return out


def as_arrow(cfg, logs: dict) -> dict:
    schema = schema_of(cfg)
    imps = logs[cfg.join.impressions_topic]
    return {**logs, cfg.join.impressions_topic: {p: arrow_records(schema, [v for _, v in recs])
                                                  for p, recs in imps.items()}}


def written(schema: EventSchema, out: list) -> Counter:
    """The output examples as events of the model (each message decoded), with their kinds."""
    dec = Decoder(schema)
    got: Counter = Counter()
    for _key, value, headers in out:
        ev, = dec.decode(value).to_events()
        got[(dict(headers)["streamrec-feedback"].decode(), json.dumps(ev, sort_keys=True))] += 1
    return got


def one_record(tmp_path):
    """A config, its schema, one partition's JSON impression records and all of them as one Arrow record."""
    cfg = config(tmp_path)
    schema = schema_of(cfg)
    records = logs_of(cfg, *make_streams(5, 1, n=30))[cfg.join.impressions_topic][0]
    (_, record), = arrow_records(schema, [v for _, v in records], per_message=len(records))
    return cfg, schema, records, record


def test_one_arrow_record_decodes_to_each_of_its_impressions(tmp_path):
    cfg, schema, records, record = one_record(tmp_path)
    values = [v for _, v in records]
    joiner = Joiner(cfg.join, schema)
    d = joiner.decode(cfg.join.impressions_topic, None, record)
    assert d.error is None and d.many and len(d.body) == len(values) > 5
    singles = [joiner.decode(cfg.join.impressions_topic, k, v) for k, v in records]
    assert [rid for rid, _, _ in d.body] == [s.rid for s in singles]
    assert [ts for _, ts, _ in d.body] == [s.ts for s in singles]
    assert d.ts == min(s.ts for s in singles)
    assert all("label" not in ev and "labels" not in ev and ev["dense"] == [0.5, 0.25, 1.0] for _, _, ev in d.body)


def test_malformed_arrow_impressions_are_refused_whole(tmp_path):
    cfg, schema, records, record = one_record(tmp_path)
    values = [v for _, v in records]
    imp = cfg.join.impressions_topic
    joiner = Joiner(cfg.join, schema, partitions=2)
    assert "Arrow" in joiner.decode(imp, None, record[:len(record) // 2]).error  # cut short
    labelled = Decoder(schema).decode(json.dumps({**json.loads(values[0]), "label": 1}).encode())
    assert "label" in joiner.decode(imp, None, encode_arrow(labelled, schema)).error  # an impression with a label
    rid = json.loads(values[0])["request_id"]
    bad = [p for p in range(2) if joiner.decode(imp, None, arrow_records(schema, values[:1])[0][1], p).error]
    assert len(bad) == 1, f"{rid} hashes to one of the 2 partitions: refused in the other"
    assert "partition" in joiner.decode(imp, None, arrow_records(schema, values[:1])[0][1], bad[0]).error


def test_arrow_impressions_join_to_the_examples_of_their_json_form(tmp_path):
    cfg = config(tmp_path)
    schema = schema_of(cfg)
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(3, P, n=1500)
    want = len(event_time_order(r, imps, acts))  # the examples of the two topics joined in event-time order
    logs = logs_of(cfg, imps, acts)
    from_json = asyncio.run(join_all(cfg, schema, logs, cfg.join.impressions_topic, want))
    arrow = as_arrow(cfg, logs)
    cut = b"\xff\xff\xff\xff" + arrow[cfg.join.impressions_topic][0][0][1][4:40]  # a malformed Arrow record
    arrow[cfg.join.impressions_topic][0].insert(1, (None, cut))
    clients_out = asyncio.run(join_all(cfg, schema, arrow, cfg.join.actions_topic, want, keep_all=True))
    from_arrow = clients_out[EVENTS]
    assert len(from_arrow) == len(from_json) == want
    assert written(schema, from_arrow) == written(schema, from_json)
    dead = clients_out[cfg.kafka.dlq_topic]
    assert [v for _, v, _ in dead] == [cut]
    assert "Arrow" in dict(dead[0][2])["streamrec-error"].decode()


@pytest.mark.parametrize("per_message", [1, 7, 30])
def test_a_batch_counts_impressions_not_records(tmp_path, per_message):
    """A batch holds at most ``join.batch_records`` impressions (its ``tx`` carries their state), an Arrow
    record of more still whole."""
    from streamrec.joiner.input_merge import InputMerge

    m = InputMerge("i", "a", {}, 0.0, weight=lambda item: item)
    m.add("i", [(t, per_message) for t in range(10)])
    released = m.release(20, lambda t: False)
    assert len(released) == {1: 10, 7: 2, 30: 1}[per_message]  # 20 of weight, or one record that weighs more
    assert m.waiting("i") == per_message * (10 - len(released))
