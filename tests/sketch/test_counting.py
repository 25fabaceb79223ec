"""Counting: the pre-aggregating accumulator sums exactly; count-min stays within its error bound and
never under-estimates (conservative update is tighter than plain); the heavy hitters keep the
largest; top-k recall at the hot-set budget; buffered updates equal unbuffered ones; an event
with more ids than the accumulator holds is still counted exactly."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from streamrec.sketch import Accumulator, CountMinSketch, HeavyHitters, PopularitySketch, make_keys
from streamrec.sketch.keys import key_salt
from tests.helpers.sketch import T0, zipf_ids


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


def test_heavy_hitters_keep_largest():
    hh = HeavyHitters(3)
    keys = np.arange(1, 6, dtype=np.uint64)
    hh.offer(keys, np.zeros(5, np.int16), np.arange(5), np.array([5.0, 1, 4, 2, 3]))
    assert sorted(hh.ids.tolist()) == [0, 2, 4]
    hh.offer(np.array([2], np.uint64), np.zeros(1, np.int16), np.array([1]), np.array([10.0]))
    assert hh.top(1)[2].tolist() == [1] and len(hh) == 3


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
