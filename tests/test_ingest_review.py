"""Ingest review: Arrow columns decoded unlike their JSON equivalent, and dataset errors that did not
say what was wrong. Each test failed before its fix (see the git log)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from streamrec.ingest import DatasetError, Decoder, EventSchema, read_events


def _arrow(cols) -> bytes:
    t = pa.table(cols)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def _cols(n=2, **extra):
    return {"label": pa.array([1.0] * n, pa.float32()),
            "dense": pa.array([[0.0, 1.0, 2.0]] * n, pa.list_(pa.float32(), 3)), **extra}


def test_arrow_request_id_of_ints_is_converted_like_json(cfg):
    """An int64 request_id column came through as Python ints; JSON turns a non-string request_id into str."""
    dec = Decoder(EventSchema.from_config(cfg))
    arrow = _arrow(_cols(request_id=pa.array([7, None], pa.int64())))
    js = b'{"label": 1, "dense": [0, 1, 2], "request_id": 7}'
    batch, errors = dec.decode_many([arrow, js])
    assert errors == []
    assert batch.request_ids == ["7", None, "7"]


def test_arrow_uint64_ts_beyond_int64_is_refused_not_wrapped(cfg):
    """A uint64 ts of 2**63 wrapped to -2**63 (JSON refuses ts beyond int64)."""
    dec = Decoder(EventSchema.from_config(cfg))
    big = _arrow(_cols(ts=pa.array([5, 2**63], pa.uint64())))
    fine = _arrow(_cols(ts=pa.array([5, 6], pa.uint64())))
    batch, errors = dec.decode_many([big, fine, json.dumps({"ts": 2**63, "label": 1, "dense": [0, 1, 2]}).encode()])
    assert [i for i, _ in errors] == [0, 2], errors
    assert "int64" in errors[0][1] and "ts" in errors[0][1]
    assert [int(t) for t in batch.ts] == [5, 6]


def test_empty_csv_says_it_is_empty(tmp_path, cfg):
    """An empty CSV gave "unknown column ''"."""
    p = tmp_path / "ev.csv"
    p.write_text("")
    with pytest.raises(DatasetError) as e:
        list(read_events(p, cfg))
    assert "empty" in str(e.value) and "header" in str(e.value) and "unknown column" not in str(e.value)


def test_unknown_csv_column_message_without_dense_features(tmp_path):
    """With dense_dim 0 the message listed 'dense_0..dense_-1'."""
    from tests.conftest import small_config

    cfg = small_config(tmp_path, **{"model.dense_dim": 0})
    p = tmp_path / "ev.csv"
    p.write_text("label,colour\n1,3\n")
    with pytest.raises(DatasetError) as e:
        list(read_events(p, cfg))
    msg = str(e.value)
    assert "unknown column 'colour'" in msg and "dense_-1" not in msg and "dense_0" not in msg
