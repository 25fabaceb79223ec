"""Poison records on a real broker: each kind of record that once stopped the trainer (and the sketch
worker, which reads the same topic with the same decoder) before its checkpoint, so that it
crash-looped, is interleaved with good events. The trainer trains every good event, exits normally
when the topic goes idle, and puts each poison record in the dead-letter topic with its bytes and
reason; the sketch state counts the good events and skips the poison without raising."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.ingest import REASON_HEADER, EventProducer, EventSchema, SyntheticStream, encode_json, read_topic
from tests.helpers.sketch import sketch_state
from streamrec.trainer import TrainerService

pytestmark = [pytest.mark.e2e, pytest.mark.broker]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _cols(n: int = 2, **extra) -> dict:
    return {"ts": pa.array([1] * n, pa.int64()), "label": pa.array([1.0] * n, pa.float32()),
            "dense": pa.array([[0.0, 1.0, 2.0]] * n, pa.list_(pa.float32(), 3)), **extra}


def _crafted_offsets() -> bytes:
    """request_id [None, "abcde", "fghij"] with its offsets 0, 0, 5, 10 overwritten: the second string
    starts 16 MiB before its buffer (the old decoder died of a segmentation fault reading it)."""
    m = _ipc(pa.table(_cols(3, request_id=pa.array([None, "abcde", "fghij"]))))
    valid = b"".join(x.to_bytes(4, "little") for x in (0, 0, 5, 10))
    assert m.count(valid) == 1
    return m.replace(valid, b"".join(x.to_bytes(4, "little", signed=True) for x in (0, -(1 << 24), 5, 10)))


def _event(**over) -> dict:
    return {"ts": 1, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "item": 2, "tags": ["a", 3]}, **over}


# poison kind -> (bytes, a word its dead-letter reason must hold)
POISON = {
    "Arrow duplicate column": (
        _ipc(pa.Table.from_arrays([*_cols().values(), pa.array([[1], [2]]), pa.array([[3], [4]])],
                                  names=["ts", "label", "dense", "user", "user"])), "duplicate column"),
    "Arrow invalid UTF-8 string": (
        _ipc(pa.table(_cols(request_id=pa.array([b"ok", b"\xed\xa0\x80"], pa.binary()).view(pa.string())))),
        "UTF-8"),
    "Arrow string offsets outside the buffer": (_crafted_offsets(), "offset"),
    "Arrow dense 3e38": (
        _ipc(pa.table(_cols(dense=pa.array([[0.0, 1.0, 2.0], [0.0, 3e38, 0.0]], pa.list_(pa.float32(), 3))))),
        "dense_abs_max"),
    # the standard json module turns both into a lone surrogate (orjson refuses the JSON itself)
    "JSON id with bytes ED A0 80": (
        json.dumps(_event(sparse={"user": "\ud800"}), ensure_ascii=False).encode("utf-8", "surrogatepass"),
        "surrogate|bad JSON"),
    "JSON request_id with a \\ud800 escape": (json.dumps(_event(request_id="x\ud800")).encode(), "surrogate|bad JSON"),
    "JSON user with a \\udfff escape": (json.dumps(_event(user="\udfff", sparse={"item": 2})).encode(),
                                        "surrogate|bad JSON"),
    "JSON dense 3e38": (json.dumps(_event(dense=[0, 3e38, 0])).encode(), "dense_abs_max"),
}


def _trainer_cfg(cfg):
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 128, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 10**9, 600.0  # only the final checkpoint
    t.hot_source, t.snapshot_every, t.push_snapshots = "none", 0, False
    t.idle_exit_s, t.log_every_s = 2.0, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 64
    return cfg


def test_poison_records_are_dead_lettered_and_every_good_event_is_trained(topics, bootstrap):
    cfg = _trainer_cfg(topics)
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest), codec="arrow")
    good = 0
    batches = list(SyntheticStream(cfg, chunk=200).batches(200 * len(POISON)))
    for k, (b, (raw, _)) in enumerate(zip(batches, POISON.values())):
        prod.send_batch(b)  # Arrow messages of 64 events
        for ev in b.take(np.arange(5)).to_events():  # and a few good JSON events among them
            prod.send_raw(encode_json(ev))
        good += len(b) + 5
        prod.send_raw(raw, key=f"poison-{k}".encode())
    prod.close()

    summary = TrainerService(trainer_settings(cfg), bootstrap, progress=False).run()
    assert summary["reason"] == "idle"
    assert summary["events"] == good
    assert summary["dead_letters"] == len(POISON)

    dlq = {r.key.decode(): r for r in read_topic(bootstrap, cfg.kafka.dlq_topic, timeout=20, expected=len(POISON))}
    assert sorted(dlq) == sorted(f"poison-{k}" for k in range(len(POISON)))
    for k, (kind, (raw, why)) in enumerate(POISON.items()):
        rec = dlq[f"poison-{k}"]
        assert rec.value == raw, kind
        reason = dict(rec.headers)[REASON_HEADER].decode()
        assert any(w in reason for w in why.split("|")), (kind, reason)

    # the sketch worker reads the same records with the same decoder: none raises, the good are counted
    state = sketch_state(cfg)
    records = read_topic(bootstrap, cfg.kafka.events_topic, timeout=20, expected=prod.sent_messages)
    assert len(records) == prod.sent_messages
    for r in records:
        state.apply(r.partition, r.offset, r.value)
    assert state.stats.bad_records == len(POISON)
    assert state.stats.events == good
