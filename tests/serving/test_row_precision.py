"""Compressed rows (``serving.row_precision``) end to end: a real trainer store and model, real snapshot
files, a real gRPC server. Tolerance: int8 scores are within 2e-3 (absolute, on probabilities) of the same
rows served as fp32, and equal (1e-6) to scoring the round-tripped rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from streamrec.foundation import sha256_file
from streamrec.model import predict_batch
from streamrec.serving import SnapshotPusher
from streamrec.app.wiring import server_settings
from streamrec.serving.rows import MemoryRows
from streamrec.snapshot import empty_evidence, round_trip, rows_batch, write_snapshot
from streamrec.trainer.rowprobe import RowSample, build_row_probe
from tests.helpers.serving import events_to_batch, still_serving_v1

INT8_ATOL = 2e-3


def _snapshot(trainer, touched, precision, kind="full", parent=None):
    """The trainer's rows (every touched id) written in ``precision``, with the trainer's row probe."""
    trainer.version += 1
    cfg = trainer.cfg
    rows = [rows_batch(t, ids, trainer.store.peek(t, ids)) for t, ids in touched.rows()]
    sample = RowSample(rows, cfg.model.tables)
    return write_snapshot(
        trainer.tmp / f"snap-{trainer.version}-{precision}", version=trainer.version, parent_version=parent, kind=kind,
        dense_state=trainer.model.state_dict(), rows=sample, kafka_offsets={"events:0": trainer.version},
        metrics={"auc": 0.6}, config_hash=cfg.model_hash(), newest_event_ms=trainer.newest_event_ms,
        model_config=cfg.to_dict()["model"], store_config={"init_scale": cfg.store.init_scale},
        evidence=empty_evidence(), row_precision=precision,
        row_probe=lambda: build_row_probe(trainer.model, cfg.model, sample, precision))


def _expected(trainer, touched, batch, precision):
    """The trainer's scores with the snapshot's rows round-tripped (unseen ids: their init rows)."""
    held = {t: np.array(sorted(s), np.int64) for t, s in touched.ids.items()}

    def lookup(t, ids):
        rows = trainer.store.peek(t, ids).numpy().copy()
        m = np.isin(ids, held.get(t, np.empty(0, np.int64)))
        rows[m] = round_trip(rows[m], precision)
        return torch.from_numpy(rows)

    return predict_batch(trainer.model, batch, trainer.cfg.model, lookup, torch.device("cpu"))[:, 0]


def test_int8_scores_match_round_tripped_rows(loaded):
    srv, trainer, touched, client, events, want = loaded
    batch = events_to_batch(trainer.cfg, events)
    with SnapshotPusher(srv.target, token="push-tok") as p:
        snap = _snapshot(trainer, touched, "fp32")
        assert json.loads((snap / "manifest.json").read_text())["row_probe"]["events"]
        r = p.push(snap)
        assert r.ok, r
        fp32, v = client.predict(events)
        assert v == 2
        assert np.max(np.abs(fp32 - want)) <= 1e-6
        r = p.push(_snapshot(trainer, touched, "int8"))
        assert r.ok, r
        int8, v = client.predict(events)
        assert v == 3
    assert np.max(np.abs(int8 - fp32)) <= INT8_ATOL
    assert np.max(np.abs(int8 - fp32)) > 0  # the rows did change: the comparison below means something
    assert np.max(np.abs(int8 - _expected(trainer, touched, batch, "int8"))) <= 1e-6


def test_memory_bytes_int8_at_dim_32():
    rng = np.random.default_rng(0)
    ids = np.arange(5000, dtype=np.int64)
    parts = {"t": [(ids, (rng.standard_normal((5000, 32)) * 0.1).astype(np.float32))]}
    size = {}
    for p in ("fp32", "fp16", "int8"):
        m = MemoryRows.build({"f": "t"}, {"t": 32}, torch.device("cpu"), parts, p)
        size[p] = m.nbytes()
        assert m.precision == p
    assert size["int8"] < 0.35 * size["fp32"] and size["fp16"] <= 0.5 * size["fp32"], size


def _tamper(snap):
    """Change the values of one rows file (as the writer would have written them) and fix the manifest's
    sha256 and bytes, so only the row probe can tell."""
    f = sorted(snap.glob("rows-*.parquet"))[0]
    t = pq.read_table(f)
    vec = t.column("vector").combine_chunks()
    q = vec.flatten().to_numpy(zero_copy_only=False)
    q = ((q.astype(np.int32) + 97) % 256).astype(np.uint8)
    new = pa.FixedSizeListArray.from_arrays(pa.array(q, pa.uint8()), vec.type.list_size)
    t = t.set_column(t.schema.get_field_index("vector"), t.schema.field("vector"), new)
    pq.write_table(t, f, compression="zstd")
    d = json.loads((snap / "manifest.json").read_text())
    d["files"][f.name] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    (snap / "manifest.json").write_text(json.dumps(d))


def test_rows_changed_after_the_probe_are_refused(loaded):
    srv, trainer, touched, client, events, want = loaded
    snap = _snapshot(trainer, touched, "int8")
    _tamper(snap)
    with SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(snap)
    assert not r.ok and r.code == "INVALID_ARGUMENT", r
    assert "row probe" in r.reason and "differ" in r.reason, r.reason
    still_serving_v1(client, events, want)


def test_delta_of_another_precision_is_refused(loaded):
    srv, trainer, touched, client, events, want = loaded
    snap = _snapshot(trainer, touched, "int8", kind="delta", parent=1)
    with SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(snap)
    assert not r.ok and r.code == "FAILED_PRECONDITION", r
    assert "row_precision" in r.reason and "full snapshot" in r.reason, r.reason
    still_serving_v1(client, events, want)


def test_the_trainers_publisher_sends_int8_rows_with_a_probe_serving_accepts(cfg, tmp_path):
    """``serving.row_precision = "int8"``: the publisher writes int8 rows and a row probe (a full snapshot,
    then a delta); serving checks the probe on each and serves them."""
    from streamrec.serving import ServingClient, SnapshotPusher, serve
    from streamrec.trainer.snapshots import SnapshotPublisher
    from tests.helpers.serving import FakeTrainer, make_events

    cfg.serving.push_token = "tok"
    cfg.serving.row_precision = "int8"
    trainer = FakeTrainer(cfg, tmp_path)
    with serve(server_settings(cfg), device="cpu") as srv:
        cfg.serving.target = srv.target
        pub = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snapshots",
                                model_hash=cfg.model_hash(), targets=cfg.push_targets(),
                                push=True, backoff_s=0.05, max_backoff_s=0.1,
                                pusher_factory=SnapshotPusher.factory(cfg.serving))
        try:
            for version in (1, 2):
                trainer.step()
                epoch = trainer.store.checkpoint(str(tmp_path / f"ckpt-{version}"))
                out = pub.publish(version, epoch, trainer.store, trainer.model, {}, {}, trainer.newest_event_ms)
                assert out is not None and pub.wait_idle(20)
                m = json.loads((out / "manifest.json").read_text())
                assert m["row_precision"] == "int8" and len(m["row_probe"]["events"]) == 8
                assert pub.version == version, pub.st.last_error
            assert [k for _, k in pub.st.history] == ["full", "delta"]
        finally:
            pub.close()
        with ServingClient(srv.target) as client:
            _, v = client.predict(make_events(cfg, 4))
        assert v == 2
    trainer.close()
