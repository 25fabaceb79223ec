"""Several task labels on the wire: ``labels`` in JSON, the ``labels`` struct column in Arrow IPC and Parquet,
``EventBatch.task_labels`` / ``label_matrix``, and the synthetic generator's conversion label.

A missing task label is NaN (masked), never 0; ``label`` stays the first task's label; a bad ``labels`` value
is an EventError naming what is wrong (the dead-letter path's business), never any other exception.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.foundation import EventBatch
from streamrec.foundation.model_config import TaskSpec
from streamrec.ingest import Decoder, EventError, EventSchema, SyntheticStream, encode_json, encode_messages
from streamrec.ingest.datasets import read_events, write_events
from streamrec.ingest.json_columns import decode_json_columns
from tests.conftest import fuzz_examples, small_config

TASKS = ("click", "conversion")
SCHEMA = EventSchema(("user", "item"), 2, tasks=TASKS)
DEC = Decoder(SCHEMA)
FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
NAN = float("nan")


def _ev(ts: int, **labels) -> dict:
    return {"ts": ts, "dense": [0.5, -1.0], "sparse": {"user": ts, "item": [ts, 7]}, **labels}


EVENTS = [
    _ev(1, label=1, labels={"conversion": 0}),  # label fills the first task
    _ev(2, labels={"click": 0, "conversion": None}),  # null: missing
    _ev(3, label=0),  # the single-task form: the other task is missing
    _ev(4, labels={"conversion": 1}),  # no first-task label: labels holds 0.0 there, task_labels NaN
    _ev(5, label=1, labels={"click": 1, "conversion": 1}),  # both given, agreeing
]
EXPECTED = np.array([[1, 0], [0, NAN], [0, NAN], [NAN, 1], [1, 1]], np.float32)


def _same_labels(a: EventBatch, b: EventBatch) -> None:
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.task_labels, b.task_labels)  # NaN positions must match too
    np.testing.assert_array_equal(a.ts, b.ts)


def test_json_labels_become_a_task_matrix_with_nan_for_missing():
    b = SCHEMA.batch_from_events(EVENTS)
    np.testing.assert_array_equal(b.task_labels, EXPECTED)
    assert b.task_labels.dtype == np.float32
    assert b.labels.tolist() == [1, 0, 0, 0, 1]  # the first task's, 0.0 where missing
    assert b.task_names == TASKS
    np.testing.assert_array_equal(b.label_matrix(2), EXPECTED)
    with pytest.raises(ValueError):
        b.label_matrix(3)


@pytest.mark.parametrize("codec", ["json", "arrow"])
def test_wire_round_trip_keeps_every_task_label_and_every_missing_one(codec):
    b = SCHEMA.batch_from_events(EVENTS)
    msgs = encode_messages(b, SCHEMA, codec, 2)
    got, errors = DEC.decode_many(msgs)
    assert errors == []
    _same_labels(got, b)
    for one in msgs:  # and each record alone
        DEC.decode(one)


def test_json_carries_only_present_tasks_and_label_only_when_the_first_is_present():
    evs = SCHEMA.batch_from_events(EVENTS).to_events()
    assert evs[1]["labels"] == {"click": 0.0} and evs[1]["label"] == 0.0
    assert evs[3]["labels"] == {"conversion": 1.0} and "label" not in evs[3]
    assert evs[0]["labels"] == {"click": 1.0, "conversion": 0.0}


def test_columnar_json_path_takes_labels_and_builds_the_validators_batch():
    evs = [EVENTS[i % len(EVENTS)] | {"ts": i} for i in range(64)]
    values = [encode_json(e) for e in evs]
    col = decode_json_columns(SCHEMA, values)
    assert col is not None, "a batch of valid events with labels is taken as columns"
    _same_labels(col, SCHEMA.batch_from_events(evs))
    # a disagreeing label among them: refused as columns, named by the record path
    bad = list(values)
    bad[10] = encode_json(_ev(10, label=1, labels={"click": 0}))
    assert decode_json_columns(SCHEMA, bad) is None
    batch, errors = DEC.decode_many(bad)
    assert [i for i, _ in errors] == [10] and "disagree" in errors[0][1]
    assert len(batch) == 63


def test_single_task_events_of_a_multi_task_model_have_the_other_tasks_missing():
    evs = [_ev(i, label=i % 2) for i in range(40)]
    for b in (decode_json_columns(SCHEMA, [encode_json(e) for e in evs]), SCHEMA.batch_from_events(evs)):
        assert b.task_labels.shape == (40, 2)
        assert b.task_labels[:, 0].tolist() == [i % 2 for i in range(40)]
        assert np.isnan(b.task_labels[:, 1]).all()


def test_single_task_model_keeps_no_task_matrix():
    one = EventSchema(("user", "item"), 2)
    b = one.batch_from_events([_ev(1, label=1), _ev(2, label=0)])
    assert b.task_labels is None
    np.testing.assert_array_equal(b.label_matrix(1), [[1], [0]])
    assert "labels" not in b.to_events()[0]
    with_labels = one.batch_from_events([_ev(1, labels={"click": 1}), _ev(2, label=0)])
    np.testing.assert_array_equal(with_labels.label_matrix(1), [[1], [0]])


@pytest.mark.parametrize("bad, why", [
    ({"labels": {"click": "1"}}, "'click' must be a number in [0, 1] or null"),
    ({"labels": {"click": 1.5}}, "'click' must be a number in [0, 1] or null"),
    ({"labels": {"conversion": -0.1}}, "'conversion' must be a number in [0, 1] or null"),
    ({"labels": {"click": NAN}}, "must be a number in [0, 1] or null, got nan"),
    ({"labels": {"click": [1]}}, "'click' must be a number"),
    ({"labels": {"like": 1}}, "unknown task 'like'; model tasks: click, conversion"),
    ({"labels": [1, 0]}, "labels must be an object"),
    ({"labels": "click"}, "labels must be an object"),
    ({"label": 1, "labels": {"click": 0}}, "disagree"),
    ({"label": 2, "labels": {"conversion": 1}}, "label must be a number in [0, 1]"),
    ({"labels": {}}, "missing label"),
    ({"labels": {"click": None, "conversion": None}}, "missing label"),
])
def test_bad_json_labels_are_event_errors_with_a_reason(bad, why):
    with pytest.raises(EventError) as e:
        SCHEMA.validate(_ev(1, **bad))
    assert why in str(e.value)
    # through the decoder: one dead-lettered record, with the same reason
    batch, errors = DEC.decode_many([encode_json(_ev(0, label=1)), json.dumps(_ev(1, **bad)).encode()])
    assert len(batch) == 1 and [i for i, _ in errors] == [1] and why in errors[0][1]


def test_labels_may_be_missing_when_labels_are_not_required():
    schema = EventSchema(("user", "item"), 2, require_label=False, tasks=TASKS)
    b = schema.batch_from_events([_ev(1), _ev(2, labels={}), _ev(3, labels=None)])
    assert np.isnan(b.task_labels).all() and b.labels.tolist() == [0, 0, 0]


def _table(labels: pa.Array | None, label: pa.Array | None = None, n: int = 3) -> pa.Table:
    cols = {"ts": pa.array(range(n), pa.int64())}
    if label is not None:
        cols["label"] = label
    if labels is not None:
        cols["labels"] = labels
    cols["dense"] = pa.array([[0.0, 1.0]] * n, pa.list_(pa.float32(), 2))
    cols["user"] = pa.array([[1]] * n, pa.list_(pa.int64()))
    return pa.table(cols)


def _struct(**children) -> pa.StructArray:
    return pa.StructArray.from_arrays([pa.array(v, pa.float32()) for v in children.values()], list(children))


def test_arrow_labels_struct_matches_children_by_name_and_a_missing_child_is_all_missing():
    t = _table(_struct(conversion=[1, None, 0]), pa.array([1, 0, None], pa.float32()))
    b = DEC.batch_from_table(t)
    np.testing.assert_array_equal(b.task_labels, [[1, 1], [0, NAN], [NAN, 0]])
    assert b.labels.tolist() == [1, 0, 0]
    # labels alone, no label column: accepted as long as every row has a task label
    b = DEC.batch_from_table(_table(_struct(conversion=[0, 1, 0], click=[None, 1, 1])))
    np.testing.assert_array_equal(b.task_labels, [[NAN, 0], [1, 1], [1, 0]])
    # struct-level nulls: a row without labels has none
    s = pa.StructArray.from_arrays([pa.array([1, 1, 1], pa.float32())], ["click"],
                                   mask=pa.array([False, True, False]))
    b = DEC.batch_from_table(_table(s, pa.array([1, 0, 1], pa.float32())))
    np.testing.assert_array_equal(b.task_labels, [[1, NAN], [0, NAN], [1, NAN]])


@pytest.mark.parametrize("labels, label, why", [
    (_struct(like=[1, 1, 1]), None, "unknown task 'like'; model tasks: click, conversion"),
    (pa.array([1.0, 1.0, 1.0], pa.float32()), None, "labels must be a struct"),
    (pa.StructArray.from_arrays([pa.array(["1", "0", "1"])], ["click"]), None, "'click' must be float32"),
    (_struct(click=[1, 0, 2]), None, "'click' must be a number in [0, 1] or null"),
    (_struct(click=[1, NAN, 0]), None, "'click' must be a number in [0, 1] or null"),
    (_struct(click=[1, 0, 1]), pa.array([1, 1, 1], pa.float32()), "disagree (row 1)"),
    (_struct(conversion=[1, None, 0]), None, "missing label: no task has one in row 1"),
    (_struct(click=[1, 0, 1]), pa.array([1, 5, 1], pa.float32()), "label must be in [0, 1]"),
])
def test_bad_arrow_labels_are_event_errors_with_a_reason(labels, label, why):
    t = _table(labels, label)
    with pytest.raises(EventError) as e:
        DEC.batch_from_table(t)
    assert why in str(e.value)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    batch, errors = DEC.decode_many([sink.getvalue().to_pybytes()])
    assert batch is None and len(errors) == 1 and why in errors[0][1]


def test_parquet_round_trip_of_task_labels(tmp_path: Path):
    cfg = small_config(tmp_path)
    cfg.model.tasks = [TaskSpec("click"), TaskSpec("conversion", 0.5)]
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    assert schema.tasks == TASKS
    b = SyntheticStream(cfg).batches(300).__next__()
    path = tmp_path / "events.parquet"
    assert write_events(path, [b], schema=schema) == 300
    assert "labels" in pq.read_schema(str(path)).names
    got = EventBatch.concat(list(read_events(path, schema=schema, chunk=128)), schema.dense_dim, schema.fields)
    _same_labels(got, b)
    jl = tmp_path / "events.jsonl"
    write_events(jl, [b], schema=schema)
    _same_labels(EventBatch.concat(list(read_events(jl, schema=schema)), schema.dense_dim, schema.fields), b)


def test_take_concat_and_empty_carry_task_labels():
    b = SCHEMA.batch_from_events(EVENTS)
    part = b.take(np.array([3, 0]))
    np.testing.assert_array_equal(part.task_labels, EXPECTED[[3, 0]])
    single = EventSchema(("user", "item"), 2).batch_from_events([_ev(9, label=1)])
    joined = EventBatch.concat([part, single], 2, ("user", "item"))
    np.testing.assert_array_equal(joined.task_labels, [EXPECTED[3], EXPECTED[0], [1, NAN]])
    assert joined.task_names == TASKS
    empty = EventBatch.empty(2, ("user", "item"), TASKS)
    assert empty.task_labels.shape == (0, 2) and empty.label_matrix(2).shape == (0, 2)
    assert EventBatch.empty(2, ("user", "item")).task_labels is None


_LABEL_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                              max_size=2))
_LABELS = st.one_of(
    st.dictionaries(st.sampled_from(["click", "conversion", "like", "", "\ud800"]), _LABEL_VALUES, max_size=4),
    _LABEL_VALUES)


@FUZZ
@given(labels=_LABELS, label=_LABEL_VALUES, has_label=st.booleans(), require=st.booleans())
def test_fuzzed_labels_raise_nothing_but_event_errors(labels, label, has_label, require):
    schema = EventSchema(("user", "item"), 2, require_label=require, tasks=TASKS)
    ev = _ev(1, labels=labels, **({"label": label} if has_label else {}))
    try:
        b = schema.batch_from_events([ev])
    except EventError:
        return
    tl = b.task_labels
    assert tl.shape == (1, 2)
    present = tl[~np.isnan(tl)]
    assert ((present >= 0) & (present <= 1)).all()
    assert not require or len(present)
    assert b.labels[0] == (0.0 if math.isnan(tl[0, 0]) else tl[0, 0])
    # the decoder's answer on the wire form agrees (or refuses it the same way)
    try:
        raw = json.dumps(ev).encode()
    except (ValueError, UnicodeEncodeError):
        return
    d = Decoder(schema).decode(raw)
    np.testing.assert_array_equal(d.task_labels, tl)


def _multi_cfg(tmp_path: Path, **gen):
    cfg = small_config(tmp_path)
    cfg.model.tasks = [TaskSpec("click"), TaskSpec("conversion")]
    for k, v in gen.items():
        setattr(cfg.generator, k, v)
    return cfg


def test_generator_conversion_label_is_rarer_correlated_and_partly_labelled(tmp_path: Path):
    single = small_config(tmp_path)
    multi = _multi_cfg(tmp_path)
    n = 40_000
    a = list(SyntheticStream(single).batches(n))
    b = list(SyntheticStream(multi).batches(n))
    for x, y in zip(a, b):  # the click stream is bit-identical with or without the conversion task
        assert x.labels.tobytes() == y.labels.tobytes() and x.task_labels is None
        np.testing.assert_array_equal(y.task_labels[:, 0], y.labels)
        assert x.ts.tobytes() == y.ts.tobytes() and x.dense.tobytes() == y.dense.tobytes()
    tl = np.concatenate([y.task_labels for y in b])
    conv, click = tl[:, 1], tl[:, 0]
    labelled = ~np.isnan(conv)
    assert 0.09 < labelled.mean() < 0.11  # generator.conversion_labelled = 0.1
    rate = conv[labelled].mean()
    assert 0.01 < rate < 0.08, rate  # a few percent (generator.conversion_rate = 0.03)
    assert rate < click.mean() / 3
    assert (conv[labelled & (click == 0)] == 0).all()  # only a clicked event converts
    assert conv[labelled & (click == 1)].mean() > 0.05
    again = np.concatenate([y.task_labels for y in SyntheticStream(multi).batches(n)])
    np.testing.assert_array_equal(again, tl)  # deterministic in the seed
    other = np.concatenate([y.task_labels for y in SyntheticStream(_multi_cfg(tmp_path, seed=8)).batches(n)])
    assert not np.array_equal(other, tl, equal_nan=True)


def test_generator_conversion_labelled_fraction_is_configurable(tmp_path: Path):
    cfg = _multi_cfg(tmp_path, conversion_labelled=0.5)
    tl = np.concatenate([y.task_labels for y in SyntheticStream(cfg).batches(20_000)])
    assert 0.47 < (~np.isnan(tl[:, 1])).mean() < 0.53
    with pytest.raises(ValueError, match="conversion_labelled"):
        SyntheticStream(_multi_cfg(tmp_path, conversion_labelled=1.5))


def test_generated_conversion_labels_survive_the_wire(tmp_path: Path):
    cfg = _multi_cfg(tmp_path)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    b = next(SyntheticStream(cfg).batches(200))
    for codec in ("json", "arrow"):
        got, errors = Decoder(schema).decode_many(encode_messages(b, schema, codec, 64))
        assert errors == []
        _same_labels(got, b)


@pytest.mark.broker
@pytest.mark.parametrize("codec", ["json", "arrow"])
def test_task_labels_through_the_broker(bootstrap, tmp_path: Path, codec):
    """Generated two-task events and a third-party producer's JSON with ``labels`` arrive with every task
    label and every missing one; a record with an unknown task goes to the dead-letter topic."""
    import uuid

    from confluent_kafka import Producer

    from streamrec.ingest import EventProducer, ensure_topics, pipeline_topics
    from tests.helpers.ingest import consume_all, events_of

    cfg = small_config(tmp_path, **{"model.tasks": [{"name": "click"}, {"name": "conversion"}]})
    sfx = uuid.uuid4().hex[:8]
    cfg.kafka.events_topic, cfg.kafka.dlq_topic = f"tl-{sfx}", f"tl-{sfx}.dlq"
    cfg.kafka.events_per_message = 100
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    synth = list(SyntheticStream(cfg, chunk=150).batches(300))
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec=codec)
    for b in synth:
        p.send_batch(b)
    p.close()
    hand = [{"ts": 10_000 + i, "labels": {"conversion": i % 2}, "dense": [0, 0, 0], "sparse": {"user": i}}
            for i in range(3)]
    third = Producer({"bootstrap.servers": bootstrap})
    for ev in [*hand, {"ts": 1, "labels": {"like": 1}, "dense": [0, 0, 0]}]:
        third.produce(cfg.kafka.events_topic, json.dumps(ev).encode())
    assert third.flush(30) == 0
    batches, stats = consume_all(bootstrap, cfg, 303)
    assert stats.dead_letters == 1
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    assert events_of(batches) == events_of([*synth, schema.batch_from_events(hand)])
    got = EventBatch.concat(batches, schema.dense_dim, schema.fields)
    assert got.task_labels.shape == (303, 2)
    assert np.isnan(got.task_labels[:, 1]).sum() == np.isnan(
        np.concatenate([b.task_labels[:, 1] for b in synth])).sum()
