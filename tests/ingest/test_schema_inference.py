"""The schema of an event file, read from the file: JSON lines, CSV and Parquet give their sparse fields and
dense width; a file that disagrees with a given model config is reported at start, naming the field; and
`produce`/`generate`/`demo --data` without a config use the file's schema and print it as TOML to save."""

from __future__ import annotations

import argparse
import tomllib

import pytest

from streamrec.foundation import ConfigError
from streamrec.app.config import Config, load_config
from streamrec.foundation.model_config import ModelConfig
from streamrec.ingest import DatasetError, EventSchema, SyntheticStream, infer_schema, read_events, write_events


def _write_jsonl(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_fields_in_order_of_appearance_and_dense_width(tmp_path):
    p = _write_jsonl(tmp_path / "e.jsonl", [
        {"ts": 1, "label": 1, "dense": [0.5], "sparse": {"page": "home"}},
        {"ts": 2, "label": 0, "dense": [0.1], "user": 7, "sparse": {"page": "cart", "tags": ["a", "b"]}},
    ])
    s = infer_schema(p)
    assert (s.format, s.fields, s.dense_dim) == ("jsonl", ["page", "user", "tags"], 1)
    model = tomllib.loads(s.toml())["model"]  # the printed TOML is a loadable config
    assert model == {"dense_dim": 1, "fields": [{"name": "page"}, {"name": "user"}, {"name": "tags"}]}
    cfg = Config(model=s.apply(ModelConfig()))
    assert sum(len(b) for b in read_events(p, EventSchema.from_sections(cfg.model, cfg.ingest))) == 2  # the inferred config reads the file


def test_jsonl_with_two_dense_widths_names_the_line(tmp_path):
    p = _write_jsonl(tmp_path / "e.jsonl", [{"label": 1, "dense": [1, 2], "sparse": {"a": 1}},
                                            {"label": 1, "dense": [1], "sparse": {"a": 1}}])
    with pytest.raises(DatasetError, match=r"e.jsonl:2: dense has 1 values, the events before it have 2"):
        infer_schema(p)


def test_csv_header_and_parquet_columns(tmp_path):
    csv = tmp_path / "e.csv"
    csv.write_text("label,ts,dense_0,dense_1,user,item,request_id\n1,5,0.1,0.2,u1,i1|i2,r\n")
    s = infer_schema(csv)
    assert (s.fields, s.dense_dim) == (["user", "item"], 2)
    gap = tmp_path / "gap.csv"
    gap.write_text("label,dense_0,dense_2,user\n1,0,0,u\n")
    with pytest.raises(DatasetError, match="dense_0..dense_1 without gaps"):
        infer_schema(gap)
    cfg = load_config(None, {"model.fields": [{"name": "u"}, {"name": "v"}], "model.dense_dim": 3}, env={})
    pq = tmp_path / "e.parquet"
    write_events(pq, SyntheticStream(cfg).batches(50), EventSchema.from_sections(cfg.model, cfg.ingest))
    s = infer_schema(pq)
    assert (s.format, s.fields, s.dense_dim) == ("parquet", ["u", "v"], 3)


def test_mismatches_name_the_field(tmp_path):
    csv = tmp_path / "e.csv"
    csv.write_text("label,dense_0,user,page\n1,0.1,u1,p\n")
    s = infer_schema(csv)
    problems = s.mismatches(ModelConfig())  # default model: user, item, category, tags; dense_dim 4
    assert any("sparse field 'page' is in" in p for p in problems)
    assert any("model field 'item' has no column" in p for p in problems)
    assert any("dense: " in p and "1 values per event" in p and "model.dense_dim = 4" in p for p in problems)
    assert s.mismatches(s.apply(ModelConfig())) == []


def _args(**kw):
    base = dict(config=None, overrides=[])
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_command_without_a_model_config_takes_the_files_schema_and_prints_it(tmp_path, capsys, monkeypatch):
    from streamrec.app.data_schema import model_for_file

    for k in [k for k in __import__("os").environ if k.startswith("STREAMREC_MODEL__")]:
        monkeypatch.delenv(k)
    p = _write_jsonl(tmp_path / "e.jsonl", [{"label": 1, "dense": [0.5], "sparse": {"page": 1}}])
    cfg = model_for_file(Config(), _args(), str(p), "produce")
    assert cfg.model.field_names == ["page"] and cfg.model.dense_dim == 1
    err = capsys.readouterr().err
    assert "no model config given" in err and 'fields = [{ name = "page" }]' in err
    with pytest.raises(ConfigError, match=r"sparse field 'page' is in .*e.jsonl but not in the model config"):
        model_for_file(Config(), _args(overrides=["model.dense_dim=1"]), str(p), "produce")


def test_generate_like_a_file_and_demo_config_read_the_schema(tmp_path, monkeypatch):
    from streamrec.app.cli import main
    from streamrec.app.demo import demo_config

    monkeypatch.chdir(tmp_path)
    csv = tmp_path / "e.csv"
    csv.write_text("label,ts,dense_0,page,shop\n1,5,0.1,p1,s1\n0,6,0.3,p2,s2\n")
    assert main(["generate", "--like", str(csv), "--events", "20", "--out", str(tmp_path / "g.jsonl")]) == 0
    assert infer_schema(tmp_path / "g.jsonl").fields == ["page", "shop"]
    args = argparse.Namespace(config=None, overrides=[], data=str(csv), layout="auto", events=None, trainers=None,
                              rate=1000.0, predict=5)
    cfg = demo_config(Config(), args, tmp_path / "run")
    assert cfg.model.field_names == ["page", "shop"] and cfg.model.dense_dim == 1
