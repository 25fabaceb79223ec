"""The row codec (fp32, fp16, int8 row-wise) and row files written in each precision."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from streamrec.model import DLRM
from streamrec.snapshot import (SnapshotError, decode_rows, encode_rows, iter_rows, round_trip, rows_batch,
                                verify_snapshot, write_snapshot)
from streamrec.snapshot.format import Manifest


def _rows(n=2000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x *= np.logspace(-6, 4, n, dtype=np.float32)[:, None]  # tiny to large magnitudes
    x[:10] = 3.25  # constant rows
    x[10] = -1e-7
    x[11] = 0.0
    x[12, :] = 0.0
    x[12, 5] = 60000.0  # one outlier in a row
    return x


def test_int8_error_bound_holds():
    x = _rows()
    enc = encode_rows(x, "int8")
    assert enc["vector"].dtype == np.uint8 and enc["scale"].dtype == np.float16 and enc["bias"].dtype == np.float16
    dec = decode_rows(enc, "int8")
    assert dec.dtype == np.float32 and dec.shape == x.shape
    s = enc["scale"].astype(np.float64)
    b = enc["bias"].astype(np.float64)
    lo = x.min(1).astype(np.float64)
    hi = x.max(1).astype(np.float64)
    bound = s / 2 + np.abs(lo - b) + 255 * np.abs((hi - lo) / 255 - s)
    err = np.abs(x.astype(np.float64) - dec).max(1)
    assert np.all(err <= bound * (1 + 1e-6) + 1e-12), np.max(err - bound)
    # a constant row has scale 0 and decodes to its bias; 3.25 is exact in float16
    assert np.all(enc["scale"][:10] == 0) and np.all(enc["vector"][:10] == 0)
    assert np.array_equal(dec[:10], x[:10])
    # the bound is tight enough to mean something: half a step on an ordinary row
    ordinary = 1000
    assert err[ordinary] <= (hi[ordinary] - lo[ordinary]) / 255 * 0.51 + abs(lo[ordinary]) * 2 ** -10


def test_fp16_and_fp32():
    x = _rows()
    assert np.array_equal(round_trip(x, "fp32"), x)
    h = round_trip(x, "fp16")
    assert np.array_equal(h, x.astype(np.float16).astype(np.float32))
    assert np.all(np.abs(h - x) <= np.abs(x) * 2 ** -11 + 2 ** -25)


def test_decode_is_deterministic_and_refuses_what_float16_cannot_hold():
    x = _rows(seed=3)
    a, b = encode_rows(x, "int8"), encode_rows(x.copy(), "int8")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(round_trip(x, "int8"), round_trip(x, "int8"))
    # row-wise: a row encodes the same alone as in a batch (the trainer's probe rounds rows one by one)
    assert np.array_equal(round_trip(x[1500:1501], "int8")[0], round_trip(x, "int8")[1500])
    big = np.array([[1.0, 1e5]], np.float32)
    for p in ("fp16", "int8"):
        with pytest.raises(SnapshotError, match="float16"):
            encode_rows(big, p)
    with pytest.raises(SnapshotError, match="precision"):
        encode_rows(x, "int4")


def _write(path, cfg, rows, precision, **kw):
    model = DLRM.from_config(cfg.model)
    return write_snapshot(path, version=1, parent_version=None, kind="full", dense_state=model.state_dict(),
                          rows=rows, kafka_offsets={}, metrics={}, config_hash="abc", newest_event_ms=1,
                          model_config=cfg.to_dict()["model"], row_precision=precision, **kw)


def _all_rows(out):
    got = {}
    for t, ids, vecs in iter_rows(out):
        for i, v in zip(ids, vecs):
            got[(t, int(i))] = v
    return got


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_file_round_trip(tmp_path, cfg, precision):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 8)).astype(np.float32)
    b = rng.standard_normal((200, 4)).astype(np.float32)  # another width: its own file
    out = _write(tmp_path / "s", cfg, [rows_batch("user", np.arange(300), a), rows_batch("item", np.arange(200) + 5, b)],
                 precision)
    m = verify_snapshot(out)
    assert m.row_precision == precision and m.rows == 500
    got = _all_rows(out)
    ra, rb = round_trip(a, precision), round_trip(b, precision)
    assert all(np.array_equal(got[("user", i)], ra[i]) for i in range(300))
    assert all(np.array_equal(got[("item", i + 5)], rb[i]) for i in range(200))
    assert all(v.dtype == np.float32 for v in got.values())
    # a manifest that names another precision than the files hold is refused before rows are used
    d = json.loads((out / "manifest.json").read_text())
    d["row_precision"] = "fp32"
    (out / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(SnapshotError, match="row schema") as e:
        list(iter_rows(out))
    assert e.value.code == "INVALID_ARGUMENT"


def test_fp32_files_are_unchanged(tmp_path, cfg):
    rng = np.random.default_rng(2)
    rows = [rows_batch("user", np.arange(100), rng.standard_normal((100, 8)).astype(np.float32))]
    a = _write(tmp_path / "a", cfg, rows, "fp32")
    b = write_snapshot(tmp_path / "b", version=1, parent_version=None, kind="full",
                       dense_state=DLRM.from_config(cfg.model).state_dict(), rows=rows, kafka_offsets={}, metrics={},
                       config_hash="abc", newest_event_ms=1, model_config=cfg.to_dict()["model"])
    assert (a / "rows-00000.parquet").read_bytes() == (b / "rows-00000.parquet").read_bytes()
    assert pq.ParquetFile(a / "rows-00000.parquet").schema_arrow.field("vector").type.value_type == "float"
    m = verify_snapshot(b)
    assert m.row_precision == "fp32" and m.row_probe is None
    d = json.loads((b / "manifest.json").read_text())
    del d["row_precision"], d["row_probe"]  # an older writer's manifest: fp32
    assert Manifest.from_json(json.dumps(d)).row_precision == "fp32"


def test_compressed_snapshots_are_smaller(tmp_path, cfg):
    rng = np.random.default_rng(4)
    n, d = 20_000, 32
    x = (rng.standard_normal((n, d)) * 0.05).astype(np.float32)
    size = {}
    for p in ("fp32", "fp16", "int8"):
        out = _write(tmp_path / p, cfg, [rows_batch("user", np.arange(n), x)], p)
        size[p] = sum(f.stat().st_size for f in out.glob("rows-*.parquet"))
    # int8: 32 + 4 bytes a row against 128; fp16: 64 (zstd gains little on either)
    assert size["int8"] <= 0.35 * size["fp32"], size
    assert size["fp16"] <= 0.55 * size["fp32"], size


def test_bad_row_precision_and_probe_are_refused(tmp_path, cfg):
    out = _write(tmp_path / "s", cfg, [rows_batch("user", np.arange(3), np.ones((3, 8), np.float32))], "int8",
                 row_probe={"events": [{"dense": [0.5] * cfg.model.dense_dim, "sparse": {"user": [1]}}],
                            "scores": [[0.25]]})
    good = json.loads((out / "manifest.json").read_text())
    assert Manifest.from_json(json.dumps(good)).row_probe["scores"] == [[0.25]]
    bad = [("row_precision", "int4"), ("row_precision", 8),
           ("row_probe", {"events": [], "scores": []}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {"user": [2 ** 63]}}], "scores": [[0.1]]}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {"user": ["x"]}}], "scores": [[0.1]]}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {}}], "scores": [[1e400]]}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {}}], "scores": []}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {}}] * 65, "scores": [[0.1]] * 65}),
           ("row_probe", {"events": [{"dense": [1.0], "sparse": {}}], "scores": [[0.1]], "x": 1}),
           ("row_probe", [1])]
    for key, value in bad:
        d = dict(good)
        d[key] = value
        with pytest.raises(SnapshotError, match=key):
            Manifest.from_json(json.dumps(d).replace("Infinity", "1e400"))
