"""The event's optional feedback kind (``"feedback"``: negative, fake_negative, positive; absent = plain)
through every wire form: JSON record by record, JSON as columns, Arrow IPC, Parquet (string and dictionary
columns), and through take/concat/to_events; a value that is not a kind is a dead letter with its reason."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrec.foundation import FEEDBACK_CODES, EventBatch, EventError, EventSchema
from streamrec.ingest.codec import Decoder, batch_to_arrow, encode_arrow, encode_json_batch

SCHEMA = EventSchema(("user", "item"), 2)
KINDS = [None, "negative", "fake_negative", "positive"]


def _events(n: int = 48) -> list[dict]:
    out = []
    for i in range(n):
        ev = {"ts": 1000 + i, "label": float(i % 2), "dense": [0.5, -1.0], "sparse": {"user": [i], "item": [7]},
              "request_id": f"r{i}"}
        if KINDS[i % 4] is not None:
            ev["feedback"] = KINDS[i % 4]
        out.append(ev)
    return out


def _codes(events) -> list[int]:
    return [FEEDBACK_CODES.get(e.get("feedback"), 0) for e in events]


def test_the_codes_are_plain_negative_fake_negative_positive():
    assert FEEDBACK_CODES == {"negative": 1, "fake_negative": 2, "positive": 3}
    b = SCHEMA.batch_from_events(_events(4))
    assert b.feedback.dtype == np.int8 and b.feedback.tolist() == [0, 1, 2, 3]
    assert SCHEMA.batch_from_events([{k: v for k, v in e.items() if k != "feedback"} for e in _events(4)]).feedback \
        is None  # no event has a kind: no column


@pytest.mark.parametrize("n", [3, 48])  # record by record; as columns (json_columns.py)
def test_json_round_trip_keeps_every_kind(n):
    events = _events(n)
    batch, errors = Decoder(SCHEMA).decode_many([orjson.dumps(e) for e in events])
    assert errors == []
    assert batch.feedback.tolist() == _codes(events)
    again, _ = Decoder(SCHEMA).decode_many(encode_json_batch(batch))
    assert again.feedback.tolist() == _codes(events)
    assert [e.get("feedback") for e in batch.to_events()] == [e.get("feedback") for e in events]


def test_arrow_and_parquet_round_trips_keep_every_kind():
    events = _events()
    batch = SCHEMA.batch_from_events(events)
    got = Decoder(SCHEMA).decode(encode_arrow(batch, SCHEMA))
    assert got.feedback.tolist() == _codes(events)
    assert got.to_events() == batch.to_events()
    table = pa.Table.from_batches([batch_to_arrow(batch, SCHEMA)])
    for t in (table, table.set_column(table.schema.get_field_index("feedback"), "feedback",
                                      table.column("feedback").dictionary_encode())):
        buf = io.BytesIO()
        pq.write_table(t, buf)
        back = Decoder(SCHEMA).batch_from_table(pq.read_table(io.BytesIO(buf.getvalue())))
        assert back.feedback.tolist() == _codes(events)
    plain = SCHEMA.batch_from_events([{k: v for k, v in e.items() if k != "feedback"} for e in events])
    assert "feedback" not in batch_to_arrow(plain, SCHEMA).schema.names  # the wire of plain events is as before


def test_take_and_concat_carry_the_kinds():
    events = _events(8)
    b = SCHEMA.batch_from_events(events)
    plain = SCHEMA.batch_from_events([{"ts": 1, "label": 1.0, "dense": [0.0, 0.0]}])
    assert b.take(np.array([3, 0, 2])).feedback.tolist() == [3, 0, 2]
    both = EventBatch.concat([plain, b], 2, SCHEMA.fields)
    assert both.feedback.tolist() == [0] + _codes(events)
    assert EventBatch.concat([plain, plain], 2, SCHEMA.fields).feedback is None


@pytest.mark.parametrize("bad", ["click", "", 3, True, ["positive"], {"kind": "positive"}])
def test_a_bad_kind_is_a_dead_letter_with_its_reason(bad):
    ev = {**_events(1)[0], "feedback": bad}
    with pytest.raises(EventError, match="feedback must be one of negative, fake_negative, positive"):
        SCHEMA.validate(ev)
    events = _events(48)
    events[5] = ev
    batch, errors = Decoder(SCHEMA).decode_many([orjson.dumps(e) for e in events])
    assert [i for i, _ in errors] == [5] and "feedback" in errors[0][1]
    assert len(batch) == 47


def test_a_bad_arrow_kind_is_refused():
    batch = SCHEMA.batch_from_events(_events(4))
    rb = batch_to_arrow(batch, SCHEMA)
    i = rb.schema.get_field_index("feedback")
    wrong = rb.set_column(i, "feedback", pa.array(["positive", "later", None, "negative"]))
    with pytest.raises(EventError, match="feedback must be one of .*'later'"):
        Decoder(SCHEMA).batch_from_table(wrong)
    ints = rb.set_column(i, "feedback", pa.array([1, 2, 3, 0]))
    with pytest.raises(EventError, match="feedback must be a string column"):
        Decoder(SCHEMA).batch_from_table(ints)
