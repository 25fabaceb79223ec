"""The snapshot format: round trip, verification of sizes and hashes, bad manifests."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from streamrec.snapshot import SnapshotError, iter_rows, read_dense, rows_batch, verify_snapshot, write_snapshot
from streamrec.snapshot.format import Manifest
from streamrec.model import DLRM


def _write(path, cfg, version=1, parent=None, kind="full", n=50, rows_per_file=1_000_000):
    model = DLRM.from_config(cfg.model)
    rng = np.random.default_rng(version)
    rows = [rows_batch("user", np.arange(n, dtype=np.int64), rng.standard_normal((n, 8)).astype(np.float32)),
            rows_batch("item", np.arange(n, dtype=np.int64) - 7, rng.standard_normal((n, 8)).astype(np.float32))]
    out = write_snapshot(path, version=version, parent_version=parent, kind=kind, dense_state=model.state_dict(),
                         rows=rows, kafka_offsets={("events", 0): 10}, metrics={"auc": 0.7}, config_hash="abc",
                         newest_event_ms=123, model_config=cfg.to_dict()["model"], rows_per_file=rows_per_file)
    return out, model, rows


def test_round_trip(tmp_path, cfg):
    out, model, rows = _write(tmp_path / "s1", cfg, rows_per_file=40)
    m = verify_snapshot(out)
    assert (m.version, m.kind, m.rows, m.kafka_offsets) == (1, "full", 100, {"events:0": 10})
    assert len(m.row_files) == 2  # a file rolls over after the batch that filled it
    dense = read_dense(out)
    for k, v in model.state_dict().items():
        assert torch.equal(dense[k], v)
    got = {}
    for table, ids, vecs in iter_rows(out):
        for i, v in zip(ids, vecs):
            got[(table, int(i))] = v
    assert len(got) == 100
    want = rows[1].column("vector").flatten().to_numpy().reshape(-1, 8)[3]
    assert np.array_equal(got[("item", 3 - 7)], want)


def test_corrupt_and_truncated_files_are_detected(tmp_path, cfg):
    out, _, _ = _write(tmp_path / "s", cfg)
    f = sorted(out.glob("rows-*.parquet"))[0]
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="sha256"):
        verify_snapshot(out)
    f.write_bytes(bytes(data[:-10]))
    with pytest.raises(SnapshotError, match="truncated"):
        verify_snapshot(out)


def test_bad_manifests_are_refused(tmp_path, cfg):
    out, _, _ = _write(tmp_path / "s", cfg)
    d = json.loads((out / "manifest.json").read_text())
    for key, value, match in [("kind", "half", "kind"), ("version", 0, "version"),
                              ("files", {}, "dense.safetensors"), ("format", 9, "format")]:
        bad = dict(d, **{key: value})
        with pytest.raises(SnapshotError, match=match):
            Manifest.from_json(json.dumps(bad))
    with pytest.raises(SnapshotError, match="parent_version"):
        Manifest.from_json(json.dumps(dict(d, kind="delta", parent_version=None)))
    with pytest.raises(SnapshotError, match="already holds"):
        _write(tmp_path / "s", cfg)
