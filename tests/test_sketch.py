"""Sketch accuracy, decay, merge, serialisation, the FAE hot-set choice, and bad-record handling."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow, encode_json
from streamrec.ingest.synthetic import rank_to_id, zipf_ranks
from streamrec.sketch import (Accumulator, CountMinSketch, EventSample, HeavyHitters, HotSet, PopularitySketch, SketchState,
                    choose_hot_set, make_keys)
from streamrec.sketch.keys import key_salt

T0 = 1_700_000_000_000


def zipf_ids(n, card=100_000, s=1.1, seed=1):
    return rank_to_id("item", zipf_ranks(np.random.default_rng(seed), n, card, s))


def test_accumulator_sums_row_weights_per_key_exactly():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(0, 50, 10_000), np.array([-1, 2**62])]).astype(np.int64)
    offsets = np.concatenate([[0], np.sort(rng.integers(0, len(values), 999)), [len(values)]]).astype(np.int64)
    w = rng.random(len(offsets) - 1)
    acc = Accumulator(128)  # a row is taken only when all of its ids would fit as new keys
    assert acc.add(2, key_salt("item"), True, values, offsets, w) == len(w)
    want = collections.defaultdict(float)
    for e in range(len(w)):
        for v in values[offsets[e]:offsets[e + 1]].tolist():
            want[v] += w[e]
    keys, tables, ids, got = acc.taken()
    assert sorted(ids.tolist()) == sorted(want) and np.all(tables == 2)
    assert np.array_equal(keys, make_keys("item", ids))  # the sketch key of each (table, id)
    assert np.allclose([want[i] for i in ids.tolist()], got, rtol=1e-12)
    # a full table hands back the row to resume from; bad offsets never read out of bounds
    small = Accumulator(16)
    stop = small.add(0, np.uint64(1), True, np.arange(40, dtype=np.int64), np.arange(41, dtype=np.int64), np.ones(40))
    assert stop == 16 and small.n == 16
    with pytest.raises(ValueError, match="bad offsets"):
        Accumulator(16).add(0, np.uint64(1), True, np.arange(3, dtype=np.int64), np.array([0, 2, 9]), np.ones(2))


def test_count_min_zipf_accuracy_bound_and_never_below_truth():
    ids = zipf_ids(400_000, card=200_000)
    cms = CountMinSketch.from_error(epsilon=1e-3, delta=1e-3)
    keys = make_keys("item", ids)
    for s in range(0, len(keys), 50_000):
        cms.add(keys[s:s + 50_000])
    uk, truth = np.unique(keys, return_counts=True)
    est = cms.estimate(uk)
    assert np.all(est >= truth)  # count-min never under-estimates
    over = est - truth
    bound = cms.epsilon * cms.total
    # the guarantee: P(error > eps * N) <= delta, per key
    assert (over > bound).mean() <= cms.delta
    assert cms.total == len(keys)


def test_conservative_update_is_tighter_than_plain():
    ids = zipf_ids(200_000)
    keys = make_keys("item", ids)
    cu, plain = CountMinSketch(1024, 4), CountMinSketch(1024, 4, conservative=False)
    cu.add(keys)
    plain.add(keys)
    uk, truth = np.unique(keys, return_counts=True)
    e_cu, e_plain = cu.estimate(uk), plain.estimate(uk)
    assert np.all(e_cu >= truth) and np.all(e_cu <= e_plain)
    assert (e_cu - truth).sum() < 0.5 * (e_plain - truth).sum()


def test_top_k_recall_at_budget():
    k = 1000
    ids = zipf_ids(1_000_000, card=100_000, s=1.1, seed=3)
    ps = PopularitySketch(["item"], epsilon=1e-4, delta=1e-3, half_life_s=1e9, top_k=k)
    ts = np.full(len(ids), T0, dtype=np.int64)
    tables = np.zeros(len(ids), np.int16)
    for s in range(0, len(ids), 65_536):
        ps.update(tables[s:s + 65_536], ids[s:s + 65_536], ts[s:s + 65_536])
    counts = collections.Counter(ids.tolist())
    true_top = {i for i, _ in counts.most_common(k)}
    _, got, est = ps.top(k)
    recall = len(true_top & set(got.tolist())) / k
    assert recall >= 0.95, recall
    truth = np.array([counts[i] for i in got.tolist()], dtype=np.float64)
    assert np.all(est >= truth * (1 - 1e-9))


def test_decay_matches_half_life():
    hl = 100.0
    ps = PopularitySketch(["item"], epsilon=1e-3, delta=1e-2, half_life_s=hl, top_k=10)
    ids = np.full(1000, 42, dtype=np.int64)
    ps.update(np.zeros(1000, np.int16), ids, np.full(1000, T0))
    # nothing else happens for one half-life, then one event of another id moves "now"
    ps.update(np.zeros(1, np.int16), np.array([7]), np.array([T0 + int(hl * 1000)]))
    est = ps.estimate("item", np.array([42]))[0]
    assert abs(est - 500.0) / 500.0 < 0.01
    # and after three half-lives, with many renormalisations in between
    for j in range(1, 200):
        ps.update(np.zeros(1, np.int16), np.array([7]), np.array([T0 + int(hl * 1000) + j * 1000]))
    at = T0 + int(3 * hl * 1000)
    assert abs(ps.estimate("item", np.array([42]), at_ms=at)[0] - 125.0) / 125.0 < 0.01


def test_renormalisation_keeps_estimates():
    ps = PopularitySketch(["item"], epsilon=1e-3, delta=1e-2, half_life_s=1.0, top_k=10)
    ps.update(np.zeros(10, np.int16), np.arange(10), np.full(10, T0))
    t_late = T0 + 100_000  # 100 half-lives later: forces a renormalisation
    ps.update(np.zeros(1, np.int16), np.array([99]), np.array([t_late]))
    assert ps.t0_ms == t_late
    assert ps.estimate("item", np.array([99]))[0] == pytest.approx(1.0)
    assert ps.estimate("item", np.array([3]))[0] == pytest.approx(2.0 ** -100, rel=1e-6)


@pytest.mark.parametrize("conservative", [False, True])
def test_merge_of_halves_equals_whole(conservative, tmp_path):
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    batches = list(SyntheticStream(cfg).batches(40_000))
    fields = cfg.model.field_names

    def new():
        return PopularitySketch(fields, epsilon=1e-3, delta=1e-3, half_life_s=30.0, top_k=200,
                                conservative=conservative)

    whole, a, b = new(), new(), new()
    for i, bt in enumerate(batches):
        whole.update_batch(bt)
        (a if i % 2 else b).update_batch(bt)
    merged = a.copy().merge(b)
    assert merged.events == whole.events == 40_000
    assert merged.now_ms == whole.now_ms
    if not conservative:  # plain count-min merges exactly: cell-wise sums
        assert np.allclose(merged.cms.counts * merged.decay_factor(), whole.cms.counts * whole.decay_factor(),
                           rtol=1e-9, atol=1e-9)
    assert merged.total == pytest.approx(whole.total, rel=1e-9)
    _, w_ids, w_est = whole.top(100)
    _, m_ids, m_est = merged.top(100)
    assert len(set(w_ids.tolist()) & set(m_ids.tolist())) >= 95
    # true decayed counts of the whole stream are a lower bound for both
    for field in fields:
        vals = np.concatenate([bt.sparse[field].values for bt in batches])
        ts = np.concatenate([np.repeat(bt.ts, bt.sparse[field].lengths) for bt in batches])
        uk, inv = np.unique(vals, return_inverse=True)
        truth = np.bincount(inv, weights=np.exp2((ts - whole.now_ms) / whole.half_life_ms))
        assert np.all(merged.estimate(field, uk) >= truth * (1 - 1e-9))
        assert np.all(whole.estimate(field, uk) >= truth * (1 - 1e-9))


def test_sketch_bytes_roundtrip_and_bad_bytes():
    ps = PopularitySketch(["a", "b"], epsilon=1e-3, delta=1e-2, half_life_s=60, top_k=50)
    ps.update(np.array([0, 1, 1], np.int16), np.array([5, 6, 6]), np.array([T0, T0 + 1, T0 + 2]))
    blob = ps.to_bytes(meta={"next_offset": 17})
    back, meta = PopularitySketch.from_bytes_with_meta(blob)
    assert meta == {"next_offset": 17}
    assert np.array_equal(back.cms.counts, ps.cms.counts)
    assert back.estimate("b", np.array([6]))[0] == pytest.approx(ps.estimate("b", np.array([6]))[0])
    assert back.top(2)[1].tolist() == ps.top(2)[1].tolist()
    with pytest.raises(ValueError, match="bad magic"):
        PopularitySketch.from_bytes(b"nope")
    with pytest.raises(ValueError, match="corrupt"):
        PopularitySketch.from_bytes(blob[:40])


def test_heavy_hitters_keep_largest():
    hh = HeavyHitters(3)
    keys = np.arange(1, 6, dtype=np.uint64)
    hh.offer(keys, np.zeros(5, np.int16), np.arange(5), np.array([5.0, 1, 4, 2, 3]))
    assert sorted(hh.ids.tolist()) == [0, 2, 4]
    hh.offer(np.array([2], np.uint64), np.zeros(1, np.int16), np.array([1]), np.array([10.0]))
    assert hh.top(1)[2].tolist() == [1] and len(hh) == 3


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


def test_malformed_records_never_reach_the_sketch(tmp_path):
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    st = SketchState(cfg)
    schema = EventSchema.from_config(cfg)
    good = next(SyntheticStream(cfg).batches(100))
    bad = [b"", b"garbage", b'{"ts": 1, "label": 7}', b"\xff\xff\xff\xff broken arrow",
           encode_json({"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"nope": 1}}), None]
    for off, v in enumerate(bad):
        assert st.apply(0, off, v) is False
    assert st.stats.bad_records == len(bad) and st.merged() is None and st.choose(1) is None
    assert st.apply(0, len(bad), encode_arrow(good, schema)) is True
    assert st.stats.events == 100 and st.merged().events == 100
    # a redelivered record (offset below the snapshot's) is not counted twice
    blob = st.snapshot(0)
    st2 = SketchState(cfg)
    st2.restore(0, blob)
    assert st2.apply(0, len(bad), encode_arrow(good, schema)) is False and st2.stats.skipped == 1
    assert st2.merged().events == 100


def test_decay_weights_of_a_batch_are_exact():
    """Per-id decayed counts after update_batch equal an exact numpy sum (any event-time span)."""
    from streamrec.ingest import EventBatch, JaggedIds

    rng = np.random.default_rng(5)
    n = 20_000
    ts = np.sort(T0 + rng.integers(0, 200_000, n))  # 200 s: wider than any one-chunk shortcut
    lists = [rng.integers(0, 300, rng.integers(0, 4)).tolist() for _ in range(n)]
    jag = JaggedIds.from_lists(lists)
    batch = EventBatch(ts=ts, labels=np.zeros(n, np.float32), dense=np.zeros((n, 1), np.float32),
                       sparse={"tags": jag})
    ps = PopularitySketch(["tags"], epsilon=1e-4, delta=1e-3, half_life_s=60.0, top_k=10, conservative=False)
    ps.update_batch(batch)
    per_id_ts = np.repeat(ts, jag.lengths)
    uu, inv = np.unique(jag.values, return_inverse=True)
    truth = np.bincount(inv, weights=np.exp2((per_id_ts - ps.now_ms) / 60_000.0))
    est = ps.estimate("tags", uu)
    assert np.all(est >= truth * (1 - 1e-12))
    assert np.allclose(est, truth, rtol=1e-9)  # 300 ids in 7 rows of 32768 cells: some row free of collisions
    assert ps.total == pytest.approx(truth.sum(), rel=1e-12)


def test_buffered_updates_equal_unbuffered():
    ids = zipf_ids(100_000)
    ts = T0 + np.arange(len(ids)) // 10  # 10 s, then a 100 s jump (flush on span)
    ts[-1000:] += 100_000
    a = PopularitySketch(["item"], epsilon=1e-3, delta=1e-2, half_life_s=30, top_k=100, conservative=False)
    b = PopularitySketch(["item"], epsilon=1e-3, delta=1e-2, half_life_s=30, top_k=100, conservative=False,
                         buffer_ids=0)
    for s in range(0, len(ids), 7_000):
        sl = slice(s, s + 7_000)
        a.update(np.zeros(len(ids[sl]), np.int16), ids[sl], ts[sl])
        b.update(np.zeros(len(ids[sl]), np.int16), ids[sl], ts[sl])
    assert a._buf_n > 0  # something still buffered: reads must flush it
    assert np.allclose(a.cms.counts, b.cms.counts, rtol=1e-9, atol=1e-12)
    assert a.top(50)[1].tolist() == b.top(50)[1].tolist()


def test_an_event_with_more_ids_than_the_accumulator_holds_is_counted():
    """One event whose field has more ids than the pre-aggregation table holds: counted exactly (not an error)."""
    from streamrec.ingest import EventBatch, JaggedIds

    big = np.arange(1, 5_001, dtype=np.int64)  # one event, 5,000 ids in one field; accumulator of 1,024
    lists = [[7, 8], big.tolist(), [], [7]]
    jag = JaggedIds.from_lists(lists)
    n = len(lists)
    batch = EventBatch(ts=np.full(n, T0, np.int64), labels=np.zeros(n, np.float32),
                       dense=np.zeros((n, 1), np.float32), sparse={"tags": jag})
    ps = PopularitySketch(["tags"], epsilon=1e-5, delta=1e-3, half_life_s=60.0, top_k=10, conservative=False,
                          buffer_ids=1_024)
    assert ps._acc.capacity < len(big)
    ps.update_batch(batch)
    assert ps.events == n and ps.ids == len(jag.values)
    assert ps.total == pytest.approx(len(jag.values), rel=1e-12)
    est = ps.estimate("tags", np.array([7, 8, 1, 2500, 5000]))
    truth = np.array([3, 2, 1, 1, 1])  # 7 and 8 are also among the big event's ids
    assert np.all(est >= truth * (1 - 1e-12))
    assert np.allclose(est, truth, atol=0.05)  # width 2^19: collisions among 5,002 ids are rare
