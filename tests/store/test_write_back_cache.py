"""Write-back host cache: bounded, LRU, batched write-back, same numbers as write-through."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec


def _train(store, rng, steps=40, n_ids=300):
    for step in range(steps):
        if step == 15:
            store.set_hot({"a": np.arange(5)})
        ids = np.unique(rng.zipf(1.3, 64) % n_ids).astype(np.int64)
        store.lookup("a", ids)
        store.apply_gradients("a", ids, torch.from_numpy(rng.normal(0, 1, (len(ids), 4)).astype(np.float32)))
        if step % 9 == 0:
            store.prefetch("a", rng.integers(0, n_ids, 32))


def test_cache_is_bounded_evicts_in_bulk_and_matches_write_through(tmp_path):
    on = EmbeddingStore(StoreSpec(str(tmp_path / "on"), {"a": 4}, shards=3, hot_capacity_rows=5, host_cache_rows=40))
    off = EmbeddingStore(StoreSpec(str(tmp_path / "off"), {"a": 4}, shards=3, hot_capacity_rows=5, host_cache_rows=0))
    try:
        _train(on, np.random.default_rng(7))
        _train(off, np.random.default_rng(7))
        st = on.stats()
        assert 0 < st["cache_rows"] <= 40
        assert st["cache_evicted"] > 0 and st["cache_written_back"] > 0
        assert st["cache_hits"] > 0 and st["cache_dirty"] > 0
        # far fewer bytes reach RocksDB than with write-through (no undo records, no per-step rewrite)
        assert st["bytes_written"] < off.stats()["bytes_written"] / 2
        ids = np.arange(300, dtype=np.int64)
        assert torch.equal(on.lookup("a", ids), off.lookup("a", ids))
        e_on, e_off = on.checkpoint(str(tmp_path / "c-on")), off.checkpoint(str(tmp_path / "c-off"))
        assert e_on == e_off and on.stats()["cache_dirty"] == 0

        def export(s):
            out = {}
            for b in s.changed_rows(None):
                out.update(zip(b.column("id").to_pylist(), b.column("vector").to_pylist()))
            return out
        assert export(on) == export(off)
    finally:
        on.close()
        off.close()
    with EmbeddingStore.restore(str(tmp_path / "c-on"), path=str(tmp_path / "r"), host_cache_rows=0) as r:
        with EmbeddingStore(StoreSpec(str(tmp_path / "off"), {"a": 4}, shards=3)) as o:
            assert torch.equal(r.peek("a", ids), o.peek("a", ids))


def test_promotion_takes_the_row_out_of_the_cache(tmp_path):
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=2, hot_capacity_rows=2,
                                  host_cache_rows=10)) as s:
        s.apply_gradients("a", np.array([1, 2, 3]), torch.ones(3, 4))  # cached, dirty, never written
        assert s.stats()["cache_dirty"] == 3 and s.stats()["bytes_written"] == 0
        s.set_hot({"a": np.array([1, 2])})
        assert s.tables["a"].cache.find(np.array([1, 2, 3])).tolist()[:2] == [-1, -1]  # one owner
        s.apply_gradients("a", np.array([1, 3]), torch.ones(2, 4))
        v = s.lookup("a", np.array([1, 2, 3])).clone()
        s.set_hot({"a": np.array([3])})  # 1, 2 demoted to RocksDB; 3 leaves the cache for the hot tier
        assert torch.equal(s.lookup("a", np.array([1, 2, 3])), v)
        assert s.tables["a"].cache.find(np.array([3]))[0] == -1
        assert s.stats()["cache_rows"] == 2 and s.stats()["cache_dirty"] == 0  # 1, 2 re-read, clean


def test_expire_sees_cached_rows(tmp_path):
    from tests.helpers.waiting import instant_between

    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=2, host_cache_rows=50)) as s:
        s.apply_gradients("a", np.arange(20), torch.zeros(20, 4))
        cutoff = instant_between()  # rows written before it are old, rows written after it are fresh
        s.apply_gradients("a", np.array([10, 11]), torch.ones(2, 4))
        fresh = s.lookup("a", np.array([10, 11])).clone()
        assert s.expire(60.0, clock=lambda: cutoff + 60.0) == 18  # the cutoff wherever the test's own time went
        assert torch.equal(s.lookup("a", np.array([10, 11])), fresh)
        assert torch.equal(s.lookup("a", np.array([3])), torch.from_numpy(s.init_rows("a", np.array([3]))))


def test_stats_split_rocksdb_rows_and_time(tmp_path):
    """The I/O counters ``bench store`` reports: rows read (not answered by the key filter),
    rows written by write-through and by cache write-back, and time inside each."""
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=2)) as s:  # write-through, no cache
        s.apply_gradients("a", np.arange(10), torch.ones(10, 4))  # 10 new rows: filter answers, 10 written
        st = s.stats()
        assert st["cold_rows_written"] == 10 and st["cold_reads"] - st["cold_reads_skipped"] == 0
        s.apply_gradients("a", np.arange(5, 15), torch.ones(10, 4))  # 5 stored rows really read, 10 written
        st = s.stats()
        assert st["cold_rows_written"] == 20 and st["cold_reads"] - st["cold_reads_skipped"] == 5
        assert st["cold_read_s"] > 0 and st["cold_write_s"] > 0
    with EmbeddingStore(StoreSpec(str(tmp_path / "c"), {"a": 4}, shards=2, host_cache_rows=8)) as s:
        s.apply_gradients("a", np.arange(8), torch.ones(8, 4))  # all held by the cache: nothing written
        assert s.stats()["cold_rows_written"] == 0
        s.apply_gradients("a", np.arange(8, 16), torch.ones(8, 4))  # evictions are written back
        st = s.stats()
        assert st["cold_rows_written"] == st["cache_written_back"] > 0
