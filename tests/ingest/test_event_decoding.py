"""Decoding events: JSON and Arrow IPC records decode to the same events (string ids hashed
with a fixed xxh64, optional keys, many records at once), and a bad record is reported by
its index and reason while the records around it decode. Arrow and JSON refuse the same
values (NaN labels, non-finite dense features, ts beyond int64)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from streamrec.ingest import Decoder, EventError, EventSchema, SyntheticStream, encode_arrow, encode_json, hash_id
from streamrec.ingest.codec import encode_json_batch
from tests.helpers.ingest import arrow_ipc


def _cols(n=2, **extra):
    return {"label": pa.array([1.0] * n, pa.float32()),
            "dense": pa.array([[0.0, 1.0, 2.0]] * n, pa.list_(pa.float32(), 3)), **extra}


def _good(ts=1):
    return {"ts": ts, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "tags": ["a", 2]}}


def test_string_id_hash_is_stable():
    # xxh64("abc", seed 0) = 0x44bc2cf5ad770999: fixed forever, on every machine
    assert hash_id("abc") == 0x44BC2CF5AD770999 == 4952883123889572249
    assert hash_id("") == 0xEF46DB3751D8E999 - 2**64  # xxh64 of no bytes, as a signed int64
    assert hash_id("ü") == hash_id("ü") != hash_id("u")
    assert hash_id(5) == 5 and hash_id(-7) == -7
    assert hash_id(2**64 - 1) == -1  # uint64 wraps to two's complement
    with pytest.raises(EventError, match="64 bits"):
        hash_id(2**64)
    with pytest.raises(EventError, match="boolean"):
        hash_id(True)


def test_decode_many_matches_single_decode_and_reports_bad_records(cfg):
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    dec = Decoder(schema)
    b = next(SyntheticStream(cfg, chunk=64).batches(64))
    msgs = encode_json_batch(b)
    arrow = encode_arrow(b.take(np.arange(10)), schema)
    values = msgs[:20] + [b"{bad", arrow, b""] + msgs[20:] + [b"\x00garbage", arrow[:40]]
    batch, errors = dec.decode_many(values)
    assert [i for i, _ in errors] == [20, 22, 67, 68]
    assert errors[0][1].startswith("bad JSON")
    assert "Arrow" in errors[3][1]
    expected = b.to_events()[:20] + b.to_events()[:10] + b.to_events()[20:]
    assert batch.to_events() == expected
    one = [dec.decode(m).to_events()[0] for m in msgs]
    assert one == b.to_events()


def test_json_event_with_string_ids_and_optional_keys(cfg):
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    ev = {"ts": 3, "label": True, "dense": [1, 2.5, 0], "user": "alice", "item": 9,
          "sparse": {"tags": ["a", 2]}, "request_id": 77}
    b = Decoder(schema).decode(encode_json(ev))
    assert b.to_events() == [{"ts": 3, "label": 1.0, "dense": [1.0, 2.5, 0.0], "request_id": "77",
                              "sparse": {"user": [hash_id("alice")], "item": [9], "tags": [hash_id("a"), 2]}}]


def test_consecutive_arrow_records_decode_together_and_bad_one_is_named(cfg, tmp_path):
    from tests.conftest import small_config

    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    other = _schema(small_config(tmp_path, **{"model.dense_dim": 2}))
    b = next(SyntheticStream(cfg, chunk=30).batches(30))
    wide = b.take(np.arange(5))
    wide.dense = wide.dense[:, :2].copy()
    msgs = [encode_arrow(b.take(np.arange(s, s + 10)), schema) for s in (0, 10, 20)]
    values = [msgs[0], msgs[1], encode_arrow(wide, other), msgs[2]]
    batch, errors = Decoder(schema).decode_many(values)
    assert [i for i, _ in errors] == [2] and "dense has 2 values, the model expects 3" in errors[0][1]
    assert batch.to_events() == b.to_events()


def test_arrow_request_id_of_ints_is_converted_like_json(cfg):
    """An int64 request_id column becomes strings, as a non-string request_id in JSON does."""
    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    arrow = arrow_ipc(_cols(request_id=pa.array([7, None], pa.int64())))
    js = b'{"label": 1, "dense": [0, 1, 2], "request_id": 7}'
    batch, errors = dec.decode_many([arrow, js])
    assert errors == []
    assert batch.request_ids == ["7", None, "7"]


def test_arrow_uint64_ts_beyond_int64_is_refused_not_wrapped(cfg):
    """A uint64 ts of 2**63 is refused as JSON refuses a ts beyond int64, never wrapped to -2**63;
    the other records of the batch decode."""
    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    big = arrow_ipc(_cols(ts=pa.array([5, 2**63], pa.uint64())))
    fine = arrow_ipc(_cols(ts=pa.array([5, 6], pa.uint64())))
    batch, errors = dec.decode_many([big, fine, json.dumps({"ts": 2**63, "label": 1, "dense": [0, 1, 2]}).encode()])
    assert [i for i, _ in errors] == [0, 2], errors
    assert "int64" in errors[0][1] and "ts" in errors[0][1]
    assert [int(t) for t in batch.ts] == [5, 6]


def test_arrow_nan_label_is_refused_like_json(cfg):
    import pyarrow as pa

    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    nan_label = arrow_ipc({"label": pa.array([float("nan")], pa.float32()),
                        "dense": pa.array([[0.0, 1.0, 2.0]], pa.list_(pa.float32(), 3))})
    batch, errors = dec.decode_many([nan_label, b'{"label": NaN, "dense": [0, 1, 2]}'])
    assert batch is None
    assert [i for i, _ in errors] == [0, 1] and all("label" in r for _, r in errors), errors


def test_non_finite_dense_values_are_refused(cfg):
    """NaN/inf dense features, or ones float32 cannot hold, are refused in JSON and Arrow alike:
    accepted, they would poison training."""
    import pyarrow as pa

    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    dense3 = pa.list_(pa.float32(), 3)
    bad = [
        b'{"label": 1, "dense": [NaN, 0, 0]}',  # Python's json accepts these non-standard literals
        b'{"label": 1, "dense": [0, -Infinity, 0]}',
        b'{"label": 1, "dense": [0, 0, 1e39]}',  # inf as float32
        arrow_ipc({"label": pa.array([1.0], pa.float32()), "dense": pa.array([[0.0, float("nan"), 1.0]], dense3)}),
        arrow_ipc({"label": pa.array([1.0], pa.float32()), "dense": pa.array([[0.0, None, 1.0]], dense3)}),
    ]
    batch, errors = dec.decode_many([json.dumps(_good()).encode(), *bad])
    assert len(batch) == 1
    assert [i for i, _ in errors] == list(range(1, len(bad) + 1))
    assert all("finite" in r for _, r in errors), errors


def _schema(cfg):
    return EventSchema.from_sections(cfg.model, cfg.ingest)
