"""Event files and codecs without a broker: Criteo/Avazu/CSV/JSONL/Parquet parsing, id hashing, batched decode."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from streamrec.ingest import (
    DatasetError, Decoder, EventError, EventSchema, SyntheticStream, avazu_config, criteo_config, detect_format,
    encode_arrow, encode_json, hash_id, read_events, read_file, write_events,
)
from streamrec.ingest.codec import encode_json_batch
from streamrec.app.cli import main as streamrec_main


def ids(batch, field):
    j = batch.sparse[field]
    return [list(map(int, j.row(i))) for i in range(len(j))]


def test_string_id_hash_is_stable():
    # xxh64("abc", seed 0) = 0x44bc2cf5ad770999: fixed forever, on every machine
    assert hash_id("abc") == 0x44BC2CF5AD770999 == 4952883123889572249
    assert hash_id("") == hash_id("")
    assert hash_id("ü") == hash_id("ü") != hash_id("u")
    assert hash_id(5) == 5 and hash_id(-7) == -7
    assert hash_id(2**64 - 1) == -1  # uint64 wraps to two's complement
    with pytest.raises(EventError, match="64 bits"):
        hash_id(2**64)
    with pytest.raises(EventError, match="boolean"):
        hash_id(True)


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
    (b,) = list(read_events(path, criteo_config()))
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
    (raw,) = list(read_events(path, criteo_config(), format="criteo", dense="raw"))
    assert raw.dense[0].tolist()[:3] == [5.0, 0.0, -3.0]


def test_criteo_bad_cells_and_wrong_config(tmp_path, cfg):
    path = tmp_path / "bad.txt"
    path.write_text(_criteo_line(1, [1], ["zz12"]) + "\n")
    with pytest.raises(DatasetError, match="'zz12' is not a hexadecimal id"):
        list(read_events(path, criteo_config(), format="criteo"))
    with pytest.raises(DatasetError, match="does not match the criteo layout"):
        read_events(path, cfg, format="criteo")  # checked before any reading starts
    short = tmp_path / "short.txt"
    short.write_text("1\t2\t3\n")
    with pytest.raises(DatasetError, match="short.txt"):
        list(read_events(short, criteo_config(), format="criteo"))


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
    cfg = avazu_config()
    assert cfg.model.dense_dim == 0 and cfg.model.field_names[0] == "C1" and len(cfg.model.fields) == 21
    (b,) = list(read_events(path, cfg))
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
    (b,) = list(read_events(path, cfg))
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
        read_events(bad, cfg)
    tsv = tmp_path / "ev.tsv"
    tsv.write_text("label\tdense_0\tdense_1\tdense_2\titem\n1\t1\t2\t3\t99\n")
    (t,) = list(read_events(tsv, cfg))
    assert ids(t, "item") == [[99]] and ids(t, "user") == [[]]


def test_parquet_and_jsonl_round_trip(tmp_path, cfg):
    src = list(SyntheticStream(cfg, chunk=1000).batches(2500))
    expected = [ev for b in src for ev in b.to_events()]
    for name in ("ev.parquet", "ev.jsonl", "ev.jsonl.gz"):
        path = tmp_path / name
        assert write_events(path, iter(src), cfg) == 2500
        got = list(read_file(path, cfg, chunk=1000))
        assert [len(b) for b in got] == [1000, 1000, 500]
        assert [ev for b in got for ev in b.to_events()] == expected, name


def test_jsonl_bad_line_names_the_line(tmp_path, cfg):
    path = tmp_path / "ev.jsonl"
    good = {"label": 1, "dense": [0, 0, 0], "sparse": {"user": 1}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "dense": [1]}) + "\n")
    with pytest.raises(DatasetError, match=r"ev.jsonl:2: dense has 1 values, the model expects 3"):
        list(read_events(path, cfg))
    with pytest.raises(DatasetError, match="extension"):
        detect_format(tmp_path / "x.bin")


def test_decode_many_matches_single_decode_and_reports_bad_records(cfg):
    schema = EventSchema.from_config(cfg)
    dec = Decoder(schema)
    b = next(SyntheticStream(cfg, chunk=64).batches(64))
    msgs = encode_json_batch(b)
    arrow = encode_arrow(b.take(np.arange(10)), schema)
    values = msgs[:20] + [b"{bad", arrow, b""] + msgs[20:] + [b"\x00garbage", arrow[:40]]
    batch, errors = dec.decode_many(values)
    assert [i for i, _ in errors] == [20, 22, 67, 68]
    assert errors[0][1].startswith("bad JSON")
    assert "Arrow" in errors[3][1]
    expected = b.to_events()[:20] + b.to_events()[:10] + b.to_events()[20:]
    assert batch.to_events() == expected
    one = [dec.decode(m).to_events()[0] for m in msgs]
    assert one == b.to_events()


def test_json_event_with_string_ids_and_optional_keys(cfg):
    schema = EventSchema.from_config(cfg)
    ev = {"ts": 3, "label": True, "dense": [1, 2.5, 0], "user": "alice", "item": 9,
          "sparse": {"tags": ["a", 2]}, "request_id": 77}
    b = Decoder(schema).decode(encode_json(ev))
    assert b.to_events() == [{"ts": 3, "label": 1.0, "dense": [1.0, 2.5, 0.0], "request_id": "77",
                              "sparse": {"user": [hash_id("alice")], "item": [9], "tags": [hash_id("a"), 2]}}]


def test_generate_command_writes_file_and_prints_bayes_auc(tmp_path, capsys):
    out = tmp_path / "gen.parquet"
    assert streamrec_main(["generate", "--out", str(out), "--events", "3000", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert "wrote 3,000 events" in text
    auc = float(text.rsplit("Bayes-optimal AUC", 1)[1])
    assert 0.6 < auc < 1.0
    from streamrec.foundation import load_config

    cfg = load_config(None, {"generator.seed": 3}, env={})
    assert sum(len(b) for b in read_events(out, cfg)) == 3000
    assert abs(SyntheticStream(cfg).bayes_auc(3000) - auc) < 1e-4


def test_consecutive_arrow_records_decode_together_and_bad_one_is_named(cfg, tmp_path):
    from tests.conftest import small_config

    schema = EventSchema.from_config(cfg)
    other = EventSchema.from_config(small_config(tmp_path, **{"model.dense_dim": 2}))
    b = next(SyntheticStream(cfg, chunk=30).batches(30))
    wide = b.take(np.arange(5))
    wide.dense = wide.dense[:, :2].copy()
    msgs = [encode_arrow(b.take(np.arange(s, s + 10)), schema) for s in (0, 10, 20)]
    values = [msgs[0], msgs[1], encode_arrow(wide, other), msgs[2]]
    batch, errors = Decoder(schema).decode_many(values)
    assert [i for i, _ in errors] == [2] and "dense has 2 values, the model expects 3" in errors[0][1]
    assert batch.to_events() == b.to_events()
