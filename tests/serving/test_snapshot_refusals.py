"""PushSnapshot refusals: a corrupt chunk, a truncated stream, a lost chunk, no manifest first,
a missing or wrong token, a wrong parent, an old version, a manifest with wrong value types, a
row file that is not the row schema. Each refusal carries the gRPC status the pusher acts on
(retry, send a full snapshot, or give up on that snapshot), leaves nothing staged, and the
version already served keeps answering."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, ServingServer, SnapshotPusher, serve, snapshot_chunks
from streamrec.app.wiring import server_settings
from streamrec.serving.pb import pb, pb_grpc
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, push_stream, still_serving_v1

pytestmark = pytest.mark.grpc


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
    data_dir = srv.settings.serving.data_dir
    assert list((Path(data_dir) / "staging").iterdir()) == []  # refused pushes leave nothing behind
    # v1 stays loaded for a rollback (serving.keep_versions)
    assert sorted(d.name for d in (Path(data_dir) / "versions").iterdir()) == ["v000000000001", "v000000000002"]
    scores, version = client.predict(events)
    assert version == 2 and np.max(np.abs(scores - trainer.scores(events_to_batch(trainer.cfg, events)))) <= 1e-6


def test_manifest_with_wrong_value_types_is_refused_and_v1_keeps_serving(cfg, tmp_path):
    """A manifest whose `files` is a list, whose created_ms is "soon", whose version is 2**70 or
    whose metrics are not numbers is refused with INVALID_ARGUMENT (final: the pusher does not
    retry it as it would an UNKNOWN), and is never installed, since every later Status call
    would then fail on it."""
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    v1 = trainer.snapshot("full", [], touched.rows())
    v2 = trainer.snapshot("full", [], touched.rows())
    srv = serve(server_settings(cfg), device="cpu")
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
                assert client.status()["version"] == 1
                # ... and our pusher says so at once instead of retrying an UNKNOWN
                bad = tmp_path / f"bad-{i}"
                shutil.copytree(v2, bad)
                (bad / "manifest.json").write_text(json.dumps(m))
                r = p.push(bad)
                assert not r.ok and r.code == "INVALID_ARGUMENT" and r.attempts == 1, (patch, r)
                assert "manifest" in r.reason, r.reason
            assert list((Path(cfg.serving.data_dir) / "staging").iterdir()) == []
            assert p.push(v2).ok and client.status()["version"] == 2
    finally:
        srv.stop(0.5)
        trainer.close()


def test_row_file_with_a_wrong_schema_is_refused_not_unknown(cfg, tmp_path):
    """A row file whose checksums match but whose columns are not the row schema (no 'vector', or a
    variable-size list) is refused as DATA_LOSS, like an unreadable row file: never UNKNOWN, which
    pushers retry. The server takes the next good push."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamrec.snapshot.format import sha256_file

    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step(n_rows=20))
    good = trainer.snapshot("full", [], touched.rows())
    bad_tables = {
        "novector": pa.table({"table": ["user"], "id": pa.array([1], pa.int64())}),
        "varlist": pa.table({"table": ["user"], "id": pa.array([1], pa.int64()),
                             "vector": pa.array([[0.0] * 8], pa.list_(pa.float32()))}),
    }
    with ServingServer(server_settings(cfg), device="cpu", port=0).start() as srv, SnapshotPusher(srv.target) as p:
        for name, table in bad_tables.items():
            d = tmp_path / name
            shutil.copytree(good, d)
            rows = sorted(d.glob("rows-*.parquet"))[0]
            pq.write_table(table, rows)
            m = json.loads((d / "manifest.json").read_text())
            m["files"][rows.name] = {"sha256": sha256_file(rows), "bytes": rows.stat().st_size}
            (d / "manifest.json").write_text(json.dumps(m))
            r = p.push(d)
            assert not r.ok and r.code == "DATA_LOSS" and rows.name in r.reason, (name, r)  # as unreadable row files
        assert p.push(good).ok  # and the server takes the next push
    trainer.close()
