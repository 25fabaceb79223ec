"""Refusals: corrupt chunk, truncated stream, wrong parent, missing/wrong token, bad
request fields, TLS. Each gets its status code, and the old version still answers."""

from __future__ import annotations

import shutil
import subprocess

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, events_to_request, serve, snapshot_chunks
from streamrec.serving.pb import pb, pb_grpc
from serving_helpers import FakeTrainer, Touched, events_to_batch, make_events


@pytest.fixture
def loaded(cfg, tmp_path):
    """A server with push and predict tokens, serving version 1; plus the trainer and events."""
    cfg.serving.push_token = "push-tok"
    cfg.serving.predict_token = "pred-tok"
    cfg.serving.max_batch = 50
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    v1 = trainer.snapshot("full", [], touched.rows())
    srv = serve(cfg, device="cpu")
    with SnapshotPusher(srv.target, token="push-tok") as p:
        assert p.push(v1).ok
    events = make_events(cfg, 20)
    want = trainer.scores(events_to_batch(cfg, events))
    client = ServingClient(srv.target, token="pred-tok")
    yield srv, trainer, touched, client, events, want
    client.close()
    srv.stop(0.5)
    trainer.close()


def still_serving_v1(client, events, want):
    scores, version = client.predict(events)
    assert version == 1
    assert np.max(np.abs(scores - want)) <= 1e-6


def push_stream(target, chunks, token="push-tok"):
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.StreamRecStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.PushSnapshot(iter(list(chunks)), timeout=20, metadata=(("authorization", f"Bearer {token}"),))
    return e.value


def test_push_refusals(loaded):
    srv, trainer, touched, client, events, want = loaded
    changed = trainer.step()
    touched.add(changed)
    v2 = trainer.snapshot("delta", changed)  # parent 1: a good delta, used corrupted/truncated below
    chunks = list(snapshot_chunks(v2, chunk_bytes=512))
    rows_at = [i for i, c in enumerate(chunks) if c.WhichOneof("part") == "chunk" and c.chunk.name.startswith("rows-")]
    assert len(rows_at) >= 2

    # corrupt chunk
    bad = [pb.SnapshotChunk.FromString(c.SerializeToString()) for c in chunks]
    data = bytearray(bad[rows_at[1]].chunk.data)
    data[5] ^= 0x55
    bad[rows_at[1]].chunk.data = bytes(data)
    err = push_stream(srv.target, bad)
    assert err.code() == grpc.StatusCode.DATA_LOSS and "sha256" in err.details()
    still_serving_v1(client, events, want)

    # truncated stream (the last chunk never arrives)
    err = push_stream(srv.target, chunks[:-1])
    assert err.code() == grpc.StatusCode.DATA_LOSS and "truncated" in err.details()
    # a lost chunk in the middle
    err = push_stream(srv.target, chunks[:rows_at[0]] + chunks[rows_at[0] + 1:])
    assert err.code() == grpc.StatusCode.DATA_LOSS and "chunk.offset" in err.details()
    # no manifest first
    err = push_stream(srv.target, chunks[1:])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "manifest_json" in err.details()
    still_serving_v1(client, events, want)

    # missing and wrong token
    for token in ("", "nope"):
        with SnapshotPusher(srv.target, token=token) as p:
            r = p.push(v2)
        assert not r.ok and r.code == "UNAUTHENTICATED" and r.attempts == 1
    still_serving_v1(client, events, want)

    # wrong parent: a delta on top of version 7
    shutil.copytree(v2, trainer.tmp / "wrong-parent")
    import json
    mpath = trainer.tmp / "wrong-parent" / "manifest.json"
    m = json.loads(mpath.read_text())
    m.update(version=9, parent_version=7)
    mpath.write_text(json.dumps(m))
    with SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(trainer.tmp / "wrong-parent")
        assert not r.ok and r.code == "FAILED_PRECONDITION" and r.needs_full and "parent" in r.reason
        still_serving_v1(client, events, want)
        # and the good delta is then accepted
        r = p.push(v2)
        assert r.ok and r.version == 2
        # an old version is refused too
        r = p.push(v2)
        assert r.code == "FAILED_PRECONDITION" and "not newer" in r.reason
    data_dir = srv.cfg.serving.data_dir
    from pathlib import Path
    assert list((Path(data_dir) / "staging").iterdir()) == []  # refused pushes leave nothing behind
    assert [d.name for d in (Path(data_dir) / "versions").iterdir()] == ["v000000000002"]  # v1 retired and removed
    scores, version = client.predict(events)
    assert version == 2 and np.max(np.abs(scores - trainer.scores(events_to_batch(trainer.cfg, events)))) <= 1e-6


def test_predict_refusals(loaded):
    srv, trainer, touched, client, events, want = loaded
    with ServingClient(srv.target) as anon:
        with pytest.raises(grpc.RpcError) as e:
            anon.predict(events)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    dd = trainer.cfg.model.dense_dim
    cases = [  # (event, field named in the per-event form, in the column form)
        (dict(events[0], dense=[1.0]), "events[0].dense", "columns.dense"),
        (dict(events[0], sparse={"nosuch": [1]}), "events[0].sparse", "columns.sparse"),
        (dict(events[0], dense=[float("nan")] * dd), "events[0].dense", "columns.dense"),
    ]
    for ev, field, col_field in cases:
        for columns, name in ((False, field), (True, col_field)):
            with pytest.raises(grpc.RpcError) as e:
                client.predict([ev], columns=columns)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    for evs, columns, name in (([], False, "events: empty"), (events * 3, False, "events: 60 events"),
                               ([], True, "columns.size: 0"), (events * 3, True, "columns.size: 60 events")):
        with pytest.raises(grpc.RpcError) as e:
            client.predict(evs, columns=columns)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    # malformed columns: lengths that do not add up (bytes and packed form), torn bytes, two forms at once
    req = events_to_request(events[:3])
    lens = np.frombuffer(req.columns.sparse["user"].lengths_u32, "<u4").copy()
    lens[0] += 1
    req.columns.sparse["user"].lengths_u32 = lens.tobytes()
    packed = events_to_request(events[:3])
    for name, col in packed.columns.sparse.items():
        col.values.extend(np.frombuffer(col.values_i64, "<i8").tolist())
        col.lengths.extend(np.frombuffer(col.lengths_u32, "<u4").tolist())
        col.values_i64, col.lengths_u32 = b"", b""
    packed.columns.dense.extend(np.frombuffer(packed.columns.dense_f32, "<f4").tolist())
    packed.columns.dense_f32 = b""
    assert np.array_equal(client.predict_request(packed)[0], client.predict(events[:3])[0])
    packed.columns.sparse["user"].lengths[0] += 1
    torn = events_to_request(events[:3])
    torn.columns.dense_f32 = torn.columns.dense_f32[:-1]
    twice = events_to_request(events[:3])
    twice.columns.dense.append(0.0)
    both = events_to_request(events[:3])
    both.events.extend(events_to_request(events[:1], columns=False).events)
    for r, name in ((req, "columns.sparse[user].values"), (packed, "columns.sparse[user].values"),
                    (torn, "columns.dense_f32"), (twice, "columns.dense_f32: send dense or dense_f32"),
                    (both, "either events or columns")):
        with pytest.raises(grpc.RpcError) as e:
            client.predict_request(r)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    assert np.array_equal(client.predict(events, columns=False)[0], client.predict(events)[0])
    still_serving_v1(client, events, want)
    st = client.status()
    assert int(st["version"]) == 1


def _self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found (needed to make a self-signed test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls(cfg, tmp_path):
    cert, key = _self_signed(tmp_path)
    cfg.serving.tls_cert, cfg.serving.tls_key = str(cert), str(key)
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    srv = serve(cfg, device="cpu")
    try:
        with SnapshotPusher(srv.target, tls_ca=str(cert)) as p:
            assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        events = make_events(cfg, 8)
        with ServingClient(srv.target, tls_ca=str(cert)) as c:
            scores, version = c.predict(events)
        assert version == 1
        assert np.max(np.abs(scores - trainer.scores(events_to_batch(cfg, events)))) <= 1e-6
        with ServingClient(srv.target, timeout=3) as plain:  # a plaintext client cannot talk to it
            with pytest.raises(grpc.RpcError) as e:
                plain.predict(events)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.stop(0.5)
        trainer.close()
