"""The hot set: FAE's choice fills the row or byte budget from one global count threshold and
reports the coverage and hit rate a direct count gives; the hot-set message round-trips and a
corrupt one is refused."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.ingest import SyntheticStream
from streamrec.sketch import EventSample, HotSet, PopularitySketch, choose_hot_set


def test_hotset_bytes_roundtrip_and_corruption():
    hs = HotSet(version=3, tables={"a": np.array([1, -2, 2**62]), "b": np.zeros(0, np.int64)}, coverage=0.5,
                hit_rate=0.9, window_start_ms=1, window_end_ms=2, created_ms=3, events=11)
    back = HotSet.from_bytes(hs.to_bytes())
    assert back.version == 3 and back.events == 11 and back.hit_rate == 0.9
    assert back.tables["a"].tolist() == [1, -2, 2**62] and back.tables["b"].size == 0
    with pytest.raises(ValueError):
        HotSet.from_bytes(hs.to_bytes()[:-3])
    with pytest.raises(ValueError, match="bad magic"):
        HotSet.from_bytes(b"{}")


def test_choose_hot_set_budget_threshold_and_coverage(tmp_path):
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    fields = cfg.model.field_names
    stream = list(SyntheticStream(cfg).batches(20_000))
    ps = PopularitySketch(fields, epsilon=1e-4, delta=1e-3, half_life_s=1e9, top_k=5000)
    sample = EventSample(capacity=50_000, rate=1.0)
    for b in stream:
        ps.update_batch(b)
        sample.offer(b)
    t, i, c = ps.candidates()
    ch = choose_hot_set(fields, t, i, c, budget_rows=500, sample=sample)
    assert ch.rows == 500 == sum(len(v) for v in ch.tables.values())
    assert c[499] == ch.threshold  # one global threshold from the counts (FAE)
    # coverage and hit rate, checked against a direct count over the same events
    hot = {(f, int(x)) for f, v in ch.tables.items() for x in v}
    lookups = hits = covered = events = 0
    for b in stream:
        for r in range(len(b)):
            row = [(f, int(x)) for f in fields for x in b.sparse[f].row(r)]
            h = sum(x in hot for x in row)
            hits += h
            lookups += len(row)
            covered += h == len(row)
            events += 1
    assert ch.hit_rate == pytest.approx(hits / lookups)
    assert ch.coverage == pytest.approx(covered / events)
    # byte budget: 'tags' rows cost more, fewer fit
    rb = {"user": 64, "item": 64, "tags": 256}
    chb = choose_hot_set(fields, t, i, c, budget_bytes=64 * 300, row_bytes=rb)
    assert chb.bytes <= 64 * 300 and chb.rows <= 300
    with pytest.raises(ValueError, match="row_bytes"):
        choose_hot_set(fields, t, i, c, budget_bytes=100, row_bytes={"user": 1})


def test_an_unchanged_hot_set_never_gets_a_new_version():
    """Same rows: republished under the last version (fresher counts) once per interval, never as a new one;
    changed rows: a new version, at once past change_fraction, else when the interval is due."""
    last = HotSet(version=4, tables={"a": np.arange(100)}, coverage=0.5, hit_rate=0.6)
    same = HotSet(version=5, tables={"a": np.arange(100)[::-1].copy()}, coverage=0.55, hit_rate=0.6)
    few = HotSet(version=5, tables={"a": np.arange(5, 105)}, coverage=0.5, hit_rate=0.6)
    many = HotSet(version=5, tables={"a": np.arange(50, 150)}, coverage=0.5, hit_rate=0.6)
    assert same.publish_as(last, due=True, change_fraction=0.2, counted_more=True) == 4
    assert same.publish_as(last, due=True, change_fraction=0.2, counted_more=False) is None
    assert same.publish_as(last, due=False, change_fraction=0.2, counted_more=True) is None
    assert few.publish_as(last, due=False, change_fraction=0.2, counted_more=True) is None
    assert few.publish_as(last, due=True, change_fraction=0.2, counted_more=True) == 5
    assert many.publish_as(last, due=False, change_fraction=0.2, counted_more=True) == 5
    assert same.publish_as(None, due=False, change_fraction=0.2, counted_more=True) == 5  # nothing published yet
    subset = HotSet(version=5, tables={"a": np.arange(50)}, coverage=0.5, hit_rate=0.6)
    assert not subset.same_rows(last) and subset.publish_as(last, True, 0.2, True) == 5


def test_a_shared_table_is_chosen_once_from_its_fields_summed_counts():
    """``user`` and ``last_clicked_user`` share table ``user``: an id's counts from both fields add up,
    the set is keyed by table, and a byte budget charges each table's own row width."""
    fields = ["user", "last_clicked_user", "item"]
    ft = {"user": "user", "last_clicked_user": "user", "item": "item"}
    t = np.array([0, 1, 2, 0])
    i = np.array([1, 1, 7, 2])
    c = np.array([5.0, 5.0, 8.0, 9.0])
    ch = choose_hot_set(fields, t, i, c, budget_rows=2, field_tables=ft)
    assert set(ch.tables) == {"user", "item"}
    assert ch.tables["user"].tolist() == [1, 2] and ch.tables["item"].tolist() == []  # 5 + 5 beats item's 8
    assert ch.threshold == 9.0
    per_field = choose_hot_set(fields, t, i, c, budget_rows=2)  # without the mapping: three tables, no sums
    assert per_field.tables["user"].tolist() == [2] and per_field.tables["item"].tolist() == [7]
    # byte budget: user rows (dim 8) cost 36 B, item rows (dim 32) 132 B
    chb = choose_hot_set(fields, t, i, c, budget_bytes=36 * 2 + 132, row_bytes={"user": 36, "item": 132}, field_tables=ft)
    assert chb.tables["user"].tolist() == [1, 2] and chb.tables["item"].tolist() == [7]
    assert chb.bytes == 36 * 2 + 132
    chb = choose_hot_set(fields, t, i, c, budget_bytes=36 * 2 + 131, row_bytes={"user": 36, "item": 132}, field_tables=ft)
    assert chb.tables["item"].tolist() == [] and chb.bytes == 72
    with pytest.raises(ValueError, match="table 'item'"):
        choose_hot_set(fields, t, i, c, budget_bytes=100, row_bytes={"user": 36}, field_tables=ft)
