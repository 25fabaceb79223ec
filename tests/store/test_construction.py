"""Opening a store: from a config (its tables and device tier), and with the same initial rows in
every instance for the same seed, so two processes agree on a row without talking."""

from __future__ import annotations

import numpy as np

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.foundation import hot_budget


def test_from_config(tmp_path):
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    with EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu") as s:
        assert set(s.tables) == {"user", "item", "tags"}
        assert s.lookup("tags", np.array([1, 1, 2])).shape == (3, 8)
        assert s.hot_capacity_rows == cfg.hot.budget_rows


def test_same_init_in_every_instance_and_seed_matters(tmp_path):
    ids = np.array([0, 1, -7, 2**62, 123456789], dtype=np.int64)
    with EmbeddingStore(StoreSpec(str(tmp_path / "x"), {"a": 16}, seed=3)) as s1, \
         EmbeddingStore(StoreSpec(str(tmp_path / "y"), {"a": 16}, seed=3)) as s2, \
         EmbeddingStore(StoreSpec(str(tmp_path / "z"), {"a": 16}, seed=4)) as s3:
        a, b, c = (s.init_rows("a", ids) for s in (s1, s2, s3))
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)
        assert a.dtype == np.float32 and a.shape == (5, 16)
        assert np.abs(a).max() <= 0.05 and np.abs(a).max() > 0.03
        assert np.array_equal(s1.lookup("a", ids).numpy(), a)
