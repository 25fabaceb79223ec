"""Input/output review: bad input that crashed a part, or was silently accepted or altered.

Each test reproduced a defect before its fix (see the git log for the commit that fixed it).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from streamrec.ingest import REASON_HEADER, Decoder, EventConsumer, EventProducer, EventSchema, read_topic


def _good(ts=1):
    return {"ts": ts, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "tags": ["a", 2]}}


# records that used to raise out of Decoder.decode_many (stopping the consumer) instead of becoming dead letters
CRASHERS = {
    "ts beyond int64": json.dumps({**_good(), "ts": 2**63}).encode(),
    "dense int beyond float": b'{"label": 1, "dense": [1' + b"0" * 400 + b', 0, 0]}',
    "deeply nested JSON": b'{"label": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


def _arrow(cols):
    import pyarrow as pa

    t = pa.table(cols)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def _arrow_string_dense():
    import pyarrow as pa

    return _arrow({"label": pa.array([1.0], pa.float32()), "dense": pa.array([["a", "b", "c"]], pa.list_(pa.string(), 3))})


CRASHERS["Arrow dense of strings"] = _arrow_string_dense()


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
    assert "finite" in reasons["dense int beyond float"]
    assert "bad JSON" in reasons["deeply nested JSON"]
    assert "dense must be a list of numbers" in reasons["Arrow dense of strings"]


def test_arrow_nan_label_is_refused_like_json(cfg):
    import pyarrow as pa

    dec = Decoder(EventSchema.from_config(cfg))
    nan_label = _arrow({"label": pa.array([float("nan")], pa.float32()),
                        "dense": pa.array([[0.0, 1.0, 2.0]], pa.list_(pa.float32(), 3))})
    batch, errors = dec.decode_many([nan_label, b'{"label": NaN, "dense": [0, 1, 2]}'])
    assert batch is None
    assert [i for i, _ in errors] == [0, 1] and all("label" in r for _, r in errors), errors


def test_non_finite_dense_values_are_refused(cfg):
    """NaN/inf dense features (or ones float32 cannot hold) used to be accepted and poison training."""
    import pyarrow as pa

    dec = Decoder(EventSchema.from_config(cfg))
    dense3 = pa.list_(pa.float32(), 3)
    bad = [
        b'{"label": 1, "dense": [NaN, 0, 0]}',  # Python's json accepts these non-standard literals
        b'{"label": 1, "dense": [0, -Infinity, 0]}',
        b'{"label": 1, "dense": [0, 0, 1e39]}',  # inf as float32
        _arrow({"label": pa.array([1.0], pa.float32()), "dense": pa.array([[0.0, float("nan"), 1.0]], dense3)}),
        _arrow({"label": pa.array([1.0], pa.float32()), "dense": pa.array([[0.0, None, 1.0]], dense3)}),
    ]
    batch, errors = dec.decode_many([json.dumps(_good()).encode(), *bad])
    assert len(batch) == 1
    assert [i for i, _ in errors] == list(range(1, len(bad) + 1))
    assert all("finite" in r for _, r in errors), errors


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


def test_csv_with_non_finite_dense_is_refused(tmp_path, cfg):
    from streamrec.ingest import DatasetError, read_events

    path = tmp_path / "ev.csv"
    path.write_text("label,dense_0,dense_1,dense_2,user\n1,0.5,0,1,7\n0,nan,0,1,8\n")
    with pytest.raises(DatasetError, match="finite"):
        list(read_events(path, cfg))


def test_jsonl_with_invalid_utf8_names_the_line(tmp_path, cfg):
    """A stray Latin-1 byte raised UnicodeDecodeError (a traceback from `streamrec produce`)."""
    from streamrec.ingest import DatasetError, read_events

    path = tmp_path / "ev.jsonl"
    good = json.dumps(_good()).encode()
    path.write_bytes(good + b"\n" + good.replace(b'"a"', b'"caf\xe9"') + b"\n")
    with pytest.raises(DatasetError, match=r"ev.jsonl:2: bad JSON"):
        list(read_events(path, cfg))


def test_csv_with_utf8_bom_reads_like_without(tmp_path, cfg):
    """Spreadsheet "CSV UTF-8" exports start with a BOM; the header check saw a column '\\ufefflabel'."""
    from streamrec.ingest import read_events

    text = "label,dense_0,dense_1,dense_2,user\n1,0.5,0,1,7\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text, encoding="utf-8")
    bom.write_text(text, encoding="utf-8-sig")
    want = [ev for b in read_events(plain, cfg) for ev in b.to_events()]
    assert len(want) == 1
    assert [ev for b in read_events(bom, cfg) for ev in b.to_events()] == want


@pytest.mark.parametrize("columns", [True, False])
def test_predict_request_shape_errors_name_the_event(columns):
    """Bad JSON shapes raised TypeError/ValueError/OverflowError (a traceback from `streamrec predict`),
    and dense lists of different lengths were concatenated, shifting values into the next event."""
    from streamrec.serving import RequestError, events_to_request

    cases = [
        ([{"dense": [1, 2, 3]}, {"dense": [4]}], r"events\[1\]\.dense"),  # 4 values = 2 x dense_dim 2
        ([{"dense": [1]}, {"sparse": [1, 2]}], r"events\[1\]\.sparse"),
        ([{"dense": [1]}, {"dense": [1], "sparse": "user"}], r"events\[1\]\.sparse"),
        ([{"dense": [1]}, {"dense": [10**400]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": [[1]]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": ["x"]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": [1], "ts": "noon"}], r"events\[1\]\.ts"),
    ]
    for events, where in cases[0 if columns else 1:]:  # one message per event has its own dense length
        with pytest.raises(RequestError, match=where):
            events_to_request(events, columns=columns)


def test_predict_reads_input_with_a_utf8_bom(tmp_path):
    """Windows editors/PowerShell write a BOM; `streamrec predict` refused such a file ("Unexpected UTF-8 BOM")."""
    from streamrec.app.commands.serve import read_events

    events = [{"dense": [1, 2, 3], "user": 1}, {"dense": [0, 0, 0], "item": "x"}]
    arr, lines = tmp_path / "a.json", tmp_path / "l.jsonl"
    arr.write_text(json.dumps(events), encoding="utf-8-sig")
    lines.write_text("\n".join(map(json.dumps, events)) + "\n", encoding="utf-8-sig")
    assert read_events(str(arr)) == events
    assert read_events(str(lines)) == events


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_predict_refuses_a_batch_size_below_one(tmp_path, capsys, batch):
    """--batch 0 sent empty requests; --batch -1 sliced events[0:-1] and silently skipped events."""
    from streamrec.app.cli import main

    path = tmp_path / "ev.jsonl"
    path.write_text('{"dense": [1, 2, 3]}\n{"dense": [1, 2, 3]}\n')
    assert main(["predict", str(path), "--batch", batch, "--target", "127.0.0.1:1", "--timeout", "2"]) == 2
    assert "--batch must be >= 1" in capsys.readouterr().err


def test_config_refuses_nan(tmp_path):
    """NaN passed every range check written as `x <= 0` (e.g. trainer.push_give_up_s) and was used as is."""
    from streamrec.foundation import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"trainer\.dense_lr: expected a number, got 'nan'"):
        load_config(None, {"trainer.dense_lr": "nan"}, env={})
    with pytest.raises(ConfigError, match=r"trainer\.push_give_up_s"):
        load_config(None, env={"STREAMREC_TRAINER__PUSH_GIVE_UP_S": "NaN"})
    f = tmp_path / "c.toml"
    f.write_text("[generator]\nlabel_noise = nan\n")
    with pytest.raises(ConfigError, match=r"generator\.label_noise"):
        load_config(f, env={})
    assert load_config(None, {"trainer.dense_lr": "0.5"}, env={}).trainer.dense_lr == 0.5


def test_unreadable_config_file_is_a_config_error(tmp_path):
    """A Latin-1 config raised UnicodeDecodeError, a directory IsADirectoryError: tracebacks from every command."""
    from streamrec.foundation import ConfigError, load_config

    latin = tmp_path / "c.toml"
    latin.write_bytes(b"[trainer]\ndevice = 'caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"c\.toml.*UTF-8"):
        load_config(latin, env={})
    with pytest.raises(ConfigError, match="config file"):
        load_config(tmp_path, env={})


def test_manifest_with_wrong_value_types_is_refused_and_v1_keeps_serving(cfg, tmp_path):
    """A manifest whose `files` was a list failed with UNKNOWN (which the pusher retries); one with
    created_ms "soon" or version 2**70 was installed and then every Status call failed."""
    import shutil
    from pathlib import Path

    import grpc

    from streamrec.serving import ServingClient, SnapshotPusher, serve, snapshot_chunks
    from streamrec.serving.pb import pb, pb_grpc
    from serving_helpers import FakeTrainer, Touched

    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    v1 = trainer.snapshot("full", [], touched.rows())
    v2 = trainer.snapshot("full", [], touched.rows())
    srv = serve(cfg, device="cpu")
    try:
        with SnapshotPusher(srv.target, attempts=2, backoff_s=0.01) as p, ServingClient(srv.target) as client, \
                grpc.insecure_channel(srv.target) as ch:
            assert p.push(v1).ok
            for i, patch in enumerate([{"files": ["dense.safetensors"]}, {"created_ms": "soon"},
                                       {"version": 2**70}, {"metrics": {"auc": "high"}}]):
                m = json.loads((v2 / "manifest.json").read_text())
                m.update(patch)
                # the server refuses it (a raw stream, as a client other than ours may send) ...
                chunks = list(snapshot_chunks(v2))
                chunks[0] = pb.SnapshotChunk(manifest_json=json.dumps(m).encode())
                with pytest.raises(grpc.RpcError) as e:
                    pb_grpc.StreamRecStub(ch).PushSnapshot(iter(chunks), timeout=20)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (patch, e.value.details())
                assert "manifest" in e.value.details()
                assert client.status()["version"] == "1"
                # ... and our pusher says so at once instead of retrying an UNKNOWN
                bad = tmp_path / f"bad-{i}"
                shutil.copytree(v2, bad)
                (bad / "manifest.json").write_text(json.dumps(m))
                r = p.push(bad)
                assert not r.ok and r.code == "INVALID_ARGUMENT" and r.attempts == 1, (patch, r)
                assert "manifest" in r.reason, r.reason
            assert list((Path(cfg.serving.data_dir) / "staging").iterdir()) == []
            assert p.push(v2).ok and client.status()["version"] == "2"
    finally:
        srv.stop(0.5)
        trainer.close()
