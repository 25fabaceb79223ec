"""Stored-key filter: never a false negative (through merges and a reopen), so skipped reads are exact."""

import numpy as np

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.embedding_store.keyset import StoredKeys


def test_no_false_negatives_through_merges():
    ks = StoredKeys(min_delta=64)
    rng = np.random.default_rng(0)
    added = []
    for _ in range(50):
        ids = rng.integers(-10**12, 10**12, 100)
        ks.add(7, ids)
        added.append(ids)
        assert ks.may_contain(7, np.concatenate(added)).all()
    fresh = rng.integers(-10**12, 10**12, 10000)
    assert ks.may_contain(7, fresh).mean() < 0.01  # mostly answered "never stored"
    assert not ks.may_contain(8, added[0]).any()   # tables are separate


def test_reopen_rebuilds_filter(tmp_path):
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": 4}, shards=3)) as s:
        ids = np.arange(0, 3000, 3)
        s.upsert_rows("t", ids, np.full((len(ids), 4), 2.5, np.float32))
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": 4}, shards=3)) as s:
        assert (s.peek("t", ids).numpy() == 2.5).all()
        assert s.cold.skipped == 0
        s.peek("t", ids + 1)  # never stored: answered without RocksDB
        assert s.cold.skipped == len(ids)
