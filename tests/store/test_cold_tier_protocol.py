"""The cold tier is an extension point: a second implementation of ``ColdTier`` (a plain dict, fine
for a unit test) plugs into ``EmbeddingStore(cold=...)`` and trains bit for bit like the built-in
RocksDB tier on the same gradient sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streamrec.embedding_store import ColdTier, EmbeddingStore, RocksDBColdTier, StoreSpec
from streamrec.embedding_store.rows import pack_records, unpack_records

TABLES = {"a": 4, "b": 3}


class DictColdTier:
    """Rows in a dict keyed by ``(tag, id)``; records kept as their packed bytes."""

    def __init__(self):
        self.rows: dict[tuple[int, int], bytes] = {}
        self.reads = 0
        self.rows_written = 0
        self.closed = False

    def get(self, tag, salt, ids, dtype):
        out = np.zeros(len(ids), dtype=dtype)
        found = np.zeros(len(ids), dtype=bool)
        self.reads += len(ids)
        hits = [(k, self.rows[(tag, int(i))]) for k, i in enumerate(ids.tolist()) if (tag, int(i)) in self.rows]
        if hits:
            pos = np.array([k for k, _ in hits])
            out[pos] = unpack_records([v for _, v in hits], dtype)
            found[pos] = True
        return out, found

    def write(self, tag, salt, ids, new, old, old_found):
        if new is None:
            for i in ids.tolist():
                self.rows.pop((tag, int(i)), None)
        else:
            self.put(tag, salt, ids, new)

    def put(self, tag, salt, ids, new):
        for i, v in zip(ids.tolist(), pack_records(new)):
            self.rows[(tag, int(i))] = bytes(v)
        self.rows_written += len(ids)

    def scan(self):
        if self.rows:
            keys = list(self.rows)
            yield (np.array([t for t, _ in keys], dtype=np.int64), np.array([i for _, i in keys], dtype=np.int64),
                   [self.rows[k] for k in keys])

    def count_estimate(self):
        return len(self.rows)

    def checkpoint(self, dest: Path):
        (Path(dest) / "rows.txt").write_text("\n".join(f"{t} {i} {v.hex()}" for (t, i), v in self.rows.items()))

    def sync_wal(self):
        pass

    def io_stats(self):
        return {"cold_reads": self.reads, "cold_rows_written": self.rows_written}

    def close(self):
        self.closed = True


def test_both_tiers_satisfy_the_protocol(tmp_path):
    assert isinstance(DictColdTier(), ColdTier)
    tier = RocksDBColdTier(str(tmp_path / "r"), shards=2, block_cache_mb=8)
    try:
        assert isinstance(tier, ColdTier)
    finally:
        tier.close()
    assert not isinstance(object(), ColdTier)


def _steps(seed: int, n: int):
    """A fixed sequence of (table, unique ids, gradients), ids drawn so rows repeat across steps."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        for table, dim in TABLES.items():
            ids = np.unique(rng.integers(0, 60, size=12)).astype(np.int64)
            yield table, ids, torch.from_numpy(rng.standard_normal((len(ids), dim)).astype(np.float32))


@pytest.mark.parametrize("host_cache_rows", [0, 16])
def test_a_store_on_a_dict_tier_trains_like_the_rocksdb_one(tmp_path, host_cache_rows):
    kw = dict(shards=2, seed=7, hot_capacity_rows=6, host_cache_rows=host_cache_rows, block_cache_mb=8)
    tier = DictColdTier()
    ref = EmbeddingStore(StoreSpec(str(tmp_path / "rocks"), TABLES, **kw))
    alt = EmbeddingStore(StoreSpec(str(tmp_path / "dict"), TABLES, **kw), cold=tier)
    try:
        assert alt.cold is tier
        for store in (ref, alt):
            store.set_hot({"a": np.array([1, 2, 3]), "b": np.array([5, 6])})
        for k, (table, ids, g) in enumerate(_steps(0, 25)):
            for store in (ref, alt):
                store.prefetch(table, ids)
                store.lookup(table, ids)
                store.apply_gradients(table, ids, g.clone())
            if k == 20:  # a migration mid-stream: demoted rows go to each store's own tier
                for store in (ref, alt):
                    store.set_hot({"a": np.array([2, 40]), "b": np.array([7])})
        every = np.arange(0, 60, dtype=np.int64)
        for table in TABLES:
            assert torch.equal(ref.peek(table, every), alt.peek(table, every))
        for store in (ref, alt):
            store.flush()
        ref_rows = {(t, i): v for t, ids, recs in ref.export_records() for i, v in zip(ids.tolist(), recs.tolist())}
        alt_rows = {(t, i): v for t, ids, recs in alt.export_records() for i, v in zip(ids.tolist(), recs.tolist())}
        assert alt_rows.keys() == ref_rows.keys() and len(alt_rows) > 20
        for key, rec in ref_rows.items():  # vectors and Adagrad state; write times differ between the stores
            got = alt_rows[key]
            assert np.array_equal(np.asarray(rec[0]), np.asarray(got[0])) and rec[1] == got[1] and rec[3] == got[3], key
        assert alt.stats()["cold_rows_written"] == tier.rows_written > 0
        assert not any(Path(tmp_path / "dict").glob("shard-*"))  # no RocksDB behind the plugged-in tier
    finally:
        ref.close()
        alt.close()
    assert tier.closed


def test_a_checkpoint_of_a_dict_tier_store_goes_through_the_tier(tmp_path):
    tier = DictColdTier()
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}), cold=tier) as store:
        store.apply_gradients("a", np.array([1, 2]), torch.ones((2, 4)))
        epoch = store.checkpoint(str(tmp_path / "ckpt"))
        assert epoch == 1
        assert len((tmp_path / "ckpt" / "rows.txt").read_text().splitlines()) == 2
        assert (tmp_path / "ckpt" / "manifest.json").exists()
