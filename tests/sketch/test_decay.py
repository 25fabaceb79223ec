"""Time decay: counts halve every half-life of event time, renormalisation (which moves the origin)
keeps every estimate, and the decayed weights of a batch equal an exact sum over its events."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.sketch import PopularitySketch
from tests.helpers.sketch import T0


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
