"""Bad input gives a clear error and leaves the store usable and unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore, StoreError, StoreMismatchError, StoreSpec


@pytest.fixture
def store(tmp_path):
    s = EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 4, "item": 4}, shards=2, hot_capacity_rows=4,
                                 max_id={"item": 1000}))
    s.apply_gradients("user", np.array([1, 2, 3]), torch.ones(3, 4))
    yield s
    s.close()


@pytest.mark.parametrize("call, match", [
    (lambda s: s.apply_gradients("user", np.array([1, 2]), torch.ones(2, 4, dtype=torch.float64)), "float32"),
    (lambda s: s.apply_gradients("user", np.array([1, 2]), torch.ones(2, 5)), r"shape \(2, 4\)"),
    (lambda s: s.apply_gradients("user", np.array([1, 2]), torch.ones(3, 4)), r"shape \(2, 4\)"),
    (lambda s: s.apply_gradients("user", np.array([1, 1]), torch.ones(2, 4)), "unique.*id 1 repeats"),
    (lambda s: s.apply_gradients("user", np.array([1, 2]), torch.tensor([[1.0] * 4, [float("nan")] * 4])),
     "NaN"),
    (lambda s: s.apply_gradients("user", [1.5, 2.0], torch.ones(2, 4)), "integers"),
    (lambda s: s.lookup("nope", np.array([1])), "unknown table 'nope'"),
    (lambda s: s.lookup("user", np.array([[1, 2]])), "1-D"),
    (lambda s: s.lookup("user", np.array([2**64 - 1], dtype=np.uint64)), "int64"),
    (lambda s: s.lookup("item", np.array([5, -1])), r"id -1 is outside \[0, 1000\)"),
    (lambda s: s.lookup("item", np.array([1000])), r"outside"),
    (lambda s: s.upsert_rows("user", np.array([1]), np.ones((1, 4))), "float32"),
    (lambda s: s.set_hot({"user": np.arange(5)}), "exceeds hot_capacity_rows=4"),
])
def test_bad_input_is_refused_and_store_stays_usable(store, call, match):
    before = store.lookup("user", np.array([1, 2, 3])).clone()
    with pytest.raises(StoreError, match=match):
        call(store)
    assert torch.equal(store.lookup("user", np.array([1, 2, 3])), before)
    store.apply_gradients("user", np.array([2]), torch.ones(1, 4))
    assert not torch.equal(store.lookup("user", np.array([2])), before[1:2])


def test_directory_of_another_layout_is_refused(tmp_path):
    EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 4}, shards=2)).close()
    with pytest.raises(StoreMismatchError, match="dim 4, asked for dim 8"):
        EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 8}, shards=2))
    with pytest.raises(StoreMismatchError, match="shards: directory has 2, asked for 3"):
        EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 4}, shards=3))
    with pytest.raises(StoreMismatchError, match="seed"):
        EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 4}, shards=2, seed=5))
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 4}, shards=2)) as s:  # still opens as it was
        assert s.lookup("user", np.array([7])).shape == (1, 4)
