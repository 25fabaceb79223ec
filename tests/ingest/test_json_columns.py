"""The columnar JSON path (``ingest/json_columns.py``) against the record-by-record validator: whenever it
answers, its batch is exactly the one the validator's path builds, record for record; for a batch of the
common shape it does answer; anything else (a bad record, an odd shape) is left to the exact path, so
``decode_many`` still names each bad record with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.foundation import EventBatch
from streamrec.ingest import Decoder, EventError, EventSchema, SyntheticStream, encode_json
from streamrec.ingest.json_columns import decode_json_columns
from tests.conftest import fuzz_examples, small_config

CFG = small_config(Path("/nonexistent/json-columns"))  # fields user, item, tags; dense 3
SCHEMA = EventSchema.from_sections(CFG.model, CFG.ingest)
DEC = Decoder(SCHEMA)
FUZZ = settings(max_examples=fuzz_examples(200), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _singles(values):
    out = []
    for v in values:
        try:
            out.append(DEC.decode(v))
        except EventError:
            out.append(None)
    return out


def _same(a, b) -> None:
    """Two batches equal in every column, dtype included."""
    assert len(a) == len(b)
    for x, y in ((a.ts, b.ts), (a.labels, b.labels), (a.dense, b.dense)):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
    for f in SCHEMA.fields:
        assert a.sparse[f].values.dtype == b.sparse[f].values.dtype == np.int64
        assert np.array_equal(a.sparse[f].values, b.sparse[f].values), f
        assert np.array_equal(a.sparse[f].offsets, b.sparse[f].offsets), f
    assert a.request_ids == b.request_ids


def _agrees(values) -> bool:
    """True when the columnar path answered; then its batch is exactly the per-record path's."""
    got = decode_json_columns(SCHEMA, values)
    if got is None:
        return False
    singles = _singles(values)
    assert all(s is not None for s in singles), "the columnar path took a record the validator refuses"
    want = EventBatch.concat(singles, SCHEMA.dense_dim, SCHEMA.fields)
    _same(got, want)
    return True


ID = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=6), st.integers(0, 50))


@st.composite
def events(draw):
    """Valid events in the shapes producers send, with now and then something the validator refuses."""
    ev = {}
    if draw(st.integers(0, 9)):  # now and then no ts at all (the validator's 0)
        ev["ts"] = draw(st.one_of(st.integers(0, 2**45), st.just(1.5), st.none(), st.just(2**64)))
    ev["label"] = draw(st.one_of(st.sampled_from([0, 1, 0.0, 1.0, 0.25]), st.just(True), st.just(2), st.none()))
    ev["dense"] = draw(st.one_of(
        st.lists(st.one_of(st.floats(-1e6, 1e6), st.integers(-1000, 1000)), min_size=3, max_size=3),
        st.lists(st.floats(-10, 10), min_size=2, max_size=2), st.just([0, None, 1])))
    sparse = {}
    for f in ("user", "item", "tags"):
        form = draw(st.sampled_from(["scalar", "list", "missing", "null", "empty"]))
        if form == "scalar":
            sparse[f] = draw(ID)
        elif form == "list":
            sparse[f] = draw(st.lists(ID, max_size=3))
        elif form == "null":
            sparse[f] = None
        elif form == "empty":
            sparse[f] = []
    if draw(st.integers(0, 20)) == 0:
        sparse["nope"] = 1
    ev["sparse"] = sparse
    rid = draw(st.one_of(st.none(), st.text(max_size=5), st.integers(0, 9), st.just("\ud800")))
    if rid is not None or draw(st.booleans()):
        ev["request_id"] = rid
    return ev


def _bytes(ev) -> bytes:
    return json.dumps(ev).encode()


@FUZZ
@given(st.lists(events(), min_size=1, max_size=40))
def test_whenever_the_columnar_path_answers_it_is_the_validators_batch(evs):
    _agrees([_bytes(e) for e in evs])


@FUZZ
@given(st.lists(events(), min_size=1, max_size=40), st.data())
def test_batches_of_one_shape_per_column_are_taken_and_exact(evs, data):
    """Events whose every field keeps one shape over the batch (what one producer sends) are taken by the
    columnar path when all are valid."""
    fixed = []
    shapes = {f: data.draw(st.sampled_from(["int", "str", "list-int", "list-str"])) for f in ("user", "item", "tags")}
    for i, e in enumerate(evs):
        sparse = {}
        for f, shape in shapes.items():
            base = data.draw(st.integers(-(2**63), 2**63 - 1)) if "int" in shape else f"id-{i}-{f}"
            sparse[f] = [base, base] if shape.startswith("list") else base
        fixed.append({"ts": 1_700_000_000_000 + i, "label": float(i % 2),
                      "dense": [0.5, -1.25, float(i)], "sparse": sparse, "request_id": f"r{i}"})
    assert _agrees([_bytes(e) for e in fixed])


def test_synthetic_stream_batches_are_taken(tmp_path):
    b = next(SyntheticStream(CFG, chunk=500).batches(500))
    values = [encode_json(ev) for ev in b.to_events()]
    assert _agrees(values)
    got, errors = DEC.decode_many(values)
    assert errors == [] and len(got) == 500


def test_one_bad_record_sends_the_batch_down_the_exact_path():
    good = [encode_json({"ts": i, "label": 1, "dense": [0, 0, 0], "sparse": {"user": i}}) for i in range(100)]
    bad = good[:50] + [b'{"ts": 1, "label": 7, "dense": [0, 0, 0]}'] + good[50:]
    assert decode_json_columns(SCHEMA, bad) is None
    batch, errors = DEC.decode_many(bad)
    assert [i for i, _ in errors] == [50] and "label" in errors[0][1]
    assert len(batch) == 100 and batch.ts.tolist() == list(range(100))


def test_shapes_the_columnar_path_leaves_to_the_validator():
    ok = encode_json({"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"user": 1}})
    for odd in (b'{"ts": 1, "label": 1, "dense": [0, 0, 0]} {"ts": 2, "label": 1, "dense": [0, 0, 0]}',
                b'{"ts": 1,\n "label": 1, "dense": [0, 0, 0]}',  # a line break inside the message
                b' {"ts": 1, "label": 1, "dense": [0, 0, 0]}',
                b'{"ts": 1, "label": 1, "dense": [0, 0, 0], "user": 5}',  # top-level user: the validator maps it
                b'{"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"user": 18446744073709551615}}',
                b'{"ts": 1, "label": 1, "dense": [0, 0, 0], "request_id": 7}'):
        values = [ok] * 40 + [odd]
        assert decode_json_columns(SCHEMA, values) is None, odd
        batch, errors = DEC.decode_many(values)
        singles = _singles(values)
        assert [i for i, _ in errors] == [i for i, s in enumerate(singles) if s is None]
