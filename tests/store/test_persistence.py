"""What the store keeps on disk and gives back: a checkpoint restores exactly (hot set included)
and the rows changed since it export as a delta; untouched rows expire; a read-only open serves
and refuses writes; a directory with a shard missing is refused."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore, StoreError, StoreSpec
from tests.helpers.waiting import instant_between

ROWS = np.arange(0, 400, dtype=np.int64)  # spread over every shard
DIM = 4


def _vec(k: int) -> np.ndarray:
    return np.full((len(ROWS), DIM), k, np.float32) + ROWS[:, None].astype(np.float32) / 1000


def test_checkpoint_restore_and_delta_export(tmp_path):
    ids = np.arange(50, dtype=np.int64)
    with EmbeddingStore(StoreSpec(str(tmp_path / "live"), {"a": 4}, shards=2, hot_capacity_rows=10)) as s:
        s.set_hot({"a": ids[:10]})
        s.apply_gradients("a", ids, torch.ones(50, 4))
        e1 = s.checkpoint(str(tmp_path / "c1"))
        at_c1 = s.lookup("a", ids).clone()
        s.apply_gradients("a", np.array([3, 30]), torch.ones(2, 4))  # one hot row, one cold row
        changed = {}
        for b in s.changed_rows(e1):
            changed.update(zip(b.column("id").to_pylist(), b.column("vector").to_pylist()))
        assert sorted(changed) == [3, 30]
        assert np.allclose(changed[30], s.lookup("a", np.array([30])).numpy()[0])
        e2 = s.checkpoint(str(tmp_path / "c2"))
        assert e2 == e1 + 1
        assert list(s.changed_rows(e2)) == []
        with pytest.raises(ValueError, match="not empty"):
            s.checkpoint(str(tmp_path / "c1"))
    r = EmbeddingStore.restore(str(tmp_path / "c1"), path=str(tmp_path / "live2"))
    with r:
        assert torch.equal(r.lookup("a", ids), at_c1)
        assert r.hot_mask("a", ids).sum() == 10


def test_expire_and_read_only_peek(tmp_path):
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=2, hot_capacity_rows=4)) as s:
        s.apply_gradients("a", np.arange(20), torch.zeros(20, 4))  # rows are stored by their first write
        s.set_hot({"a": np.arange(4)})
        cutoff = instant_between()  # rows written before it are old, rows written after it are fresh
        s.apply_gradients("a", np.array([10, 11]), torch.ones(2, 4))
        fresh = s.lookup("a", np.array([10, 11])).clone()
        n = s.expire(60.0, clock=lambda: cutoff + 60.0)  # the cutoff wherever the test's own time went
        assert n == 14  # 20 rows - 4 hot - 2 recently touched
        assert torch.equal(s.lookup("a", np.array([10, 11])), fresh)
        s.upsert_rows("a", np.array([99]), np.full((1, 4), 2.0, np.float32))
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=2, read_only=True)) as ro:
        assert torch.equal(ro.peek("a", np.array([99])), torch.full((1, 4), 2.0))
        assert torch.equal(ro.peek("a", np.array([5])), torch.from_numpy(ro.init_rows("a", np.array([5]))))
        with pytest.raises(ValueError, match="read-only"):
            ro.apply_gradients("a", np.array([1]), torch.ones(1, 4))


def test_store_with_a_missing_shard_is_refused(tmp_path):
    """A shard directory gone (a half-removed version directory, a bad copy) is refused by name, in the
    live directory and in a checkpoint: re-created empty, its rows would read as never stored."""
    path = tmp_path / "s"
    with EmbeddingStore(StoreSpec(str(path), {"t": DIM}, shards=4)) as s:
        s.upsert_rows("t", ROWS, _vec(1))
        s.checkpoint(str(tmp_path / "ck"))
    shutil.rmtree(path / "shard-002")
    with pytest.raises(StoreError, match="shard-002"):
        EmbeddingStore(StoreSpec(str(path), {"t": DIM}, shards=4))
    shutil.rmtree(tmp_path / "ck" / "shard-001")
    with pytest.raises(StoreError, match="shard-001"):
        EmbeddingStore.restore(str(tmp_path / "ck"), path=str(tmp_path / "r"))


def test_checkpoint_keeps_the_hot_set_of_tables_named_like_savez_arguments(tmp_path):
    """Tables named "file" and "allow_pickle" (np.savez's own argument names) keep their hot sets through a
    checkpoint: passed as savez keywords, one would fail every checkpoint, the other be silently dropped."""
    names = {"file": DIM, "allow_pickle": DIM}
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), names, shards=2, hot_capacity_rows=10)) as s:
        s.set_hot({"file": np.arange(3), "allow_pickle": np.arange(4)})
        s.checkpoint(str(tmp_path / "ck"))
    with EmbeddingStore.restore(str(tmp_path / "ck"), path=str(tmp_path / "r")) as r:
        assert r.hot_mask("file", np.arange(5)).tolist() == [True] * 3 + [False] * 2
        assert r.hot_mask("allow_pickle", np.arange(5)).tolist() == [True] * 4 + [False]
