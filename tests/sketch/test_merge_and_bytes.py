"""Sketches of parts of a stream merge into the sketch of the whole (exactly, cell-wise, for plain
count-min), and a sketch survives its byte form (with metadata) while bad bytes are refused."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.ingest import SyntheticStream
from streamrec.sketch import PopularitySketch
from tests.helpers.sketch import T0


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
