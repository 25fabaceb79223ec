"""Event files without a broker: Criteo, Avazu, CSV/TSV, JSONL(.gz) and Parquet parse exactly, round trip,
and a bad file or line is refused with a DatasetError that names the file, the line and what is wrong
(never a traceback from another layer). `streamrec generate` writes such a file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from streamrec.app.config import Config
from streamrec.ingest import (
    DatasetError, EventSchema, SyntheticStream, avazu_config, criteo_config, detect_format, hash_id, read_events,
    read_file, write_events,
)
from streamrec.app.cli import main as streamrec_main


def events_of(model) -> EventSchema:
    """The events of a ``[model]`` section (the other sections at their defaults)."""
    return EventSchema.from_sections(model, Config().ingest)


def ids(batch, field):
    j = batch.sparse[field]
    return [list(map(int, j.row(i))) for i in range(len(j))]


def _criteo_line(label, ints, cats):
    ints = list(ints) + [""] * (13 - len(ints))
    cats = list(cats) + [""] * (26 - len(cats))
    return "\t".join([str(label), *map(str, ints), *cats])


def test_criteo_lines_parse_exactly(tmp_path):
    lines = [
        _criteo_line(1, [5, "", -3, 0, "", "", "", "", "", "", "", "", 7], ["68fd1e64", "", "00000001", "FFFFFFFF"]),
        _criteo_line(0, [], []),  # every cell empty
        _criteo_line(0, [1] * 13, ["a"] * 25 + ["ffffffffffffffff"]),
    ]
    path = tmp_path / "day_0.tsv"
    path.write_text("\n".join(lines) + "\n")
    assert detect_format(path) == "criteo"
    (b,) = list(read_events(path, events_of(criteo_config())))
    assert b.labels.tolist() == [1.0, 0.0, 0.0]
    # empty -> 0, negative -> 0, then log(1 + x)
    expect0 = [math.log(6), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, math.log(8)]
    np.testing.assert_allclose(b.dense[0], expect0, rtol=1e-6)
    assert b.dense[1].tolist() == [0.0] * 13
    np.testing.assert_allclose(b.dense[2], [math.log(2)] * 13, rtol=1e-6)
    assert ids(b, "C1") == [[0x68FD1E64], [], [10]]
    assert ids(b, "C2") == [[], [], [10]]
    assert ids(b, "C3") == [[1], [], [10]]
    assert ids(b, "C4") == [[0xFFFFFFFF], [], [10]]
    assert ids(b, "C26") == [[], [], [-1]]  # 16 hex digits >= 2^63 wrap like hash_id
    (raw,) = list(read_events(path, events_of(criteo_config()), format="criteo", dense="raw"))
    assert raw.dense[0].tolist()[:3] == [5.0, 0.0, -3.0]


def test_criteo_bad_cells_and_wrong_config(tmp_path, cfg):
    path = tmp_path / "bad.txt"
    path.write_text(_criteo_line(1, [1], ["zz12"]) + "\n")
    with pytest.raises(DatasetError, match="'zz12' is not a hexadecimal id"):
        list(read_events(path, events_of(criteo_config()), format="criteo"))
    with pytest.raises(DatasetError, match="does not match the criteo layout"):
        read_events(path, EventSchema.from_sections(cfg.model, cfg.ingest), format="criteo")  # checked before any reading starts
    short = tmp_path / "short.txt"
    short.write_text("1\t2\t3\n")
    with pytest.raises(DatasetError, match="short.txt"):
        list(read_events(short, events_of(criteo_config()), format="criteo"))


AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")


def test_avazu_lines_parse_exactly(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(
        AVAZU_HEADER + "\n"
        "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
        "ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79\n"
        "10000169349117863715,1,14102913,1005,,,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
        "96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,\n"
    )
    assert detect_format(path) == "avazu"
    model = avazu_config()
    assert model.dense_dim == 0 and model.field_names[0] == "C1" and len(model.fields) == 21
    (b,) = list(read_events(path, events_of(model)))
    assert b.labels.tolist() == [0.0, 1.0]
    # 2014-10-21 00:00 UTC and 2014-10-29 13:00 UTC
    assert b.ts.tolist() == [1413849600000, 1414587600000]
    assert b.request_ids == ["1000009418151094273", "10000169349117863715"]
    assert b.dense.shape == (2, 0)
    assert ids(b, "C1") == [[1005], [1005]]
    assert ids(b, "banner_pos") == [[0], []]
    assert ids(b, "site_id") == [[0x1FBE01FE], []]
    assert ids(b, "device_ip") == [[0xDDD2926E], [0x96809AC8]]
    assert ids(b, "C20") == [[-1], [100084]]
    assert ids(b, "C21") == [[79], []]


def test_generic_csv_mapping(tmp_path, cfg):
    path = tmp_path / "ev.csv"
    path.write_text("label,ts,dense_0,dense_1,dense_2,user,item,tags,request_id\n"
                    "1,5,0.5,1,2,42,abc,1|2|x,r1\n"
                    "0,,,,,,7,,\n"
                    "0.25,9,1,1,1,18446744073709551615,-3,|4|,r3\n")
    (b,) = list(read_events(path, EventSchema.from_sections(cfg.model, cfg.ingest)))
    assert b.labels.tolist() == [1.0, 0.0, 0.25]
    assert b.ts.tolist() == [5, 0, 9]
    assert b.dense.tolist() == [[0.5, 1, 2], [0, 0, 0], [1, 1, 1]]
    assert ids(b, "user") == [[42], [], [-1]]
    assert ids(b, "item") == [[hash_id("abc")], [7], [-3]]
    assert ids(b, "tags") == [[1, 2, hash_id("x")], [], [4]]
    assert b.request_ids == ["r1", None, "r3"]
    bad = tmp_path / "bad.csv"
    bad.write_text("label,dense_0,dense_1,dense_2,user,colour\n1,0,0,0,1,red\n")
    with pytest.raises(DatasetError, match="unknown column 'colour'"):
        read_events(bad, EventSchema.from_sections(cfg.model, cfg.ingest))
    tsv = tmp_path / "ev.tsv"
    tsv.write_text("label\tdense_0\tdense_1\tdense_2\titem\n1\t1\t2\t3\t99\n")
    (t,) = list(read_events(tsv, EventSchema.from_sections(cfg.model, cfg.ingest)))
    assert ids(t, "item") == [[99]] and ids(t, "user") == [[]]


def test_parquet_and_jsonl_round_trip(tmp_path, cfg):
    src = list(SyntheticStream(cfg, chunk=1000).batches(2500))
    expected = [ev for b in src for ev in b.to_events()]
    for name in ("ev.parquet", "ev.jsonl", "ev.jsonl.gz"):
        path = tmp_path / name
        assert write_events(path, iter(src), EventSchema.from_sections(cfg.model, cfg.ingest)) == 2500
        got = list(read_file(path, EventSchema.from_sections(cfg.model, cfg.ingest), chunk=1000))
        assert [len(b) for b in got] == [1000, 1000, 500]
        assert [ev for b in got for ev in b.to_events()] == expected, name


def test_jsonl_bad_line_names_the_line(tmp_path, cfg):
    path = tmp_path / "ev.jsonl"
    good = {"label": 1, "dense": [0, 0, 0], "sparse": {"user": 1}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "dense": [1]}) + "\n")
    with pytest.raises(DatasetError, match=r"ev.jsonl:2: dense has 1 values, the model expects 3"):
        list(read_events(path, EventSchema.from_sections(cfg.model, cfg.ingest)))
    with pytest.raises(DatasetError, match="extension"):
        detect_format(tmp_path / "x.bin")


def test_generate_command_writes_file_and_prints_bayes_auc(tmp_path, capsys):
    out = tmp_path / "gen.parquet"
    assert streamrec_main(["generate", "--out", str(out), "--events", "3000", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert "wrote 3,000 events" in text
    auc = float(text.rsplit("Bayes-optimal AUC", 1)[1])
    assert 0.6 < auc < 1.0
    from streamrec.app.config import load_config

    cfg = load_config(None, {"generator.seed": 3}, env={})
    assert sum(len(b) for b in read_events(out, EventSchema.from_sections(cfg.model, cfg.ingest))) == 3000
    assert abs(SyntheticStream(cfg).bayes_auc(3000) - auc) < 1e-4


def test_empty_csv_says_it_is_empty(tmp_path, cfg):
    """An empty CSV is refused as empty (no header), not as having an unknown column ''."""
    p = tmp_path / "ev.csv"
    p.write_text("")
    with pytest.raises(DatasetError) as e:
        list(read_events(p, EventSchema.from_sections(cfg.model, cfg.ingest)))
    assert "empty" in str(e.value) and "header" in str(e.value) and "unknown column" not in str(e.value)


def test_unknown_csv_column_message_without_dense_features(tmp_path):
    """With dense_dim 0 the message lists no dense columns at all (no 'dense_0..dense_-1')."""
    from tests.conftest import small_config

    cfg = small_config(tmp_path, **{"model.dense_dim": 0})
    p = tmp_path / "ev.csv"
    p.write_text("label,colour\n1,3\n")
    with pytest.raises(DatasetError) as e:
        list(read_events(p, EventSchema.from_sections(cfg.model, cfg.ingest)))
    msg = str(e.value)
    assert "unknown column 'colour'" in msg and "dense_-1" not in msg and "dense_0" not in msg


def _good_event(ts=1):
    return {"ts": ts, "label": 1, "dense": [0.5, 0, 1], "sparse": {"user": 1, "tags": ["a", 2]}}


def test_csv_with_non_finite_dense_is_refused(tmp_path, cfg):
    from streamrec.ingest import DatasetError, read_events

    path = tmp_path / "ev.csv"
    path.write_text("label,dense_0,dense_1,dense_2,user\n1,0.5,0,1,7\n0,nan,0,1,8\n")
    with pytest.raises(DatasetError, match="finite"):
        list(read_events(path, EventSchema.from_sections(cfg.model, cfg.ingest)))


def test_jsonl_with_invalid_utf8_names_the_line(tmp_path, cfg):
    """A stray Latin-1 byte is a bad line, named, not a UnicodeDecodeError (a traceback from `streamrec produce`)."""
    from streamrec.ingest import DatasetError, read_events

    path = tmp_path / "ev.jsonl"
    good = json.dumps(_good_event()).encode()
    path.write_bytes(good + b"\n" + good.replace(b'"a"', b'"caf\xe9"') + b"\n")
    with pytest.raises(DatasetError, match=r"ev.jsonl:2: bad JSON"):
        list(read_events(path, EventSchema.from_sections(cfg.model, cfg.ingest)))


def test_csv_with_utf8_bom_reads_like_without(tmp_path, cfg):
    """Spreadsheet "CSV UTF-8" exports start with a BOM: it is not part of the first column's name ('\\ufefflabel')."""
    from streamrec.ingest import read_events

    text = "label,dense_0,dense_1,dense_2,user\n1,0.5,0,1,7\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text, encoding="utf-8")
    bom.write_text(text, encoding="utf-8-sig")
    want = [ev for b in read_events(plain, EventSchema.from_sections(cfg.model, cfg.ingest)) for ev in b.to_events()]
    assert len(want) == 1
    assert [ev for b in read_events(bom, EventSchema.from_sections(cfg.model, cfg.ingest)) for ev in b.to_events()] == want
