"""Frequency (TinyLFU-style) admission in front of the host cache's LRU: rows seen once do not push
out rows that come back; a refused dirty row is written back at once (nothing is lost)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.embedding_store.cache import HostCache
from streamrec.embedding_store.frequency import FrequencySketch
from streamrec.embedding_store.rows import record_dtype


def test_sketch_orders_ids_by_recent_count_and_halves():
    sk = FrequencySketch(capacity=1000)
    often, once = np.arange(100, dtype=np.int64), np.arange(10_000, 10_100, dtype=np.int64)
    for _ in range(8):
        sk.add(often)
    sk.add(once)
    assert (sk.estimate(often) >= 8).all()
    assert np.median(sk.estimate(once)) == 1  # collisions may add to a few, never take away
    assert (sk.estimate(np.array([1 << 40, -5], dtype=np.int64)) <= 1).all()
    while sk.resets == 0:
        sk.add(np.arange(20_000, 21_000, dtype=np.int64))
    assert (sk.estimate(often) <= 5).all()  # halved: recent traffic counts, old traffic fades


def _stream(cache: HostCache, steps: int, rng) -> tuple[int, int]:
    """Each step: a third of 90 recurring ids, plus 40 ids never seen again. Returns (hits, lookups) of
    the recurring ids over the second half."""
    recurring = np.arange(90, dtype=np.int64)
    dtype = cache.rec.dtype
    fresh, hits, seen = 1_000_000, 0, 0
    for step in range(steps):
        part = recurring[step % 3::3]
        once = np.arange(fresh, fresh + 40, dtype=np.int64)
        fresh += 40
        ids = np.concatenate([part, once])
        cache.record(ids)
        slots = cache.lookup(ids)
        if step >= steps // 2:
            hits += int((slots[:len(part)] >= 0).sum())
            seen += len(part)
        miss = slots < 0
        cache.insert(ids[miss], np.zeros(int(miss.sum()), dtype=dtype), np.zeros(int(miss.sum()), bool),
                     dirty=bool(step % 2))
    return hits, seen


def test_frequency_admission_keeps_recurring_rows_that_lru_loses():
    spilled = {"lru": [], "frequency": []}
    rates = {}
    for adm in ("lru", "frequency"):
        c = HostCache(100, record_dtype(4), lambda ids, recs, a=adm: spilled[a].append(ids.copy()), admission=adm)
        hits, seen = _stream(c, 120, np.random.default_rng(0))
        rates[adm] = hits / seen
        if adm == "frequency":
            assert c.refused > 0 and c.floor >= 1
    # LRU: 120 one-off rows pass between two visits of a recurring row and flush it out of 100 slots
    assert rates["lru"] < 0.2
    assert rates["frequency"] > 0.8
    # refused dirty rows were written back at once
    assert sum(len(x) for x in spilled["frequency"]) > 0


def test_admission_must_be_known():
    with pytest.raises(ValueError, match="admission"):
        HostCache(10, record_dtype(4), lambda *a: None, admission="lfu")


def test_refused_rows_lose_no_update_and_match_lru(tmp_path):
    """A tiny cache under a stream of mostly one-off ids: frequency admission refuses most of them;
    every row still reads back exactly as with the LRU cache and with no cache at all."""
    stores = {adm: EmbeddingStore(StoreSpec(str(tmp_path / adm), {"a": 4}, shards=2, hot_capacity_rows=4,
                                            host_cache_rows=rows,
                                            cache_admission=adm))
              for adm, rows in (("frequency", 16), ("lru", 16), ("off", 0))}
    try:
        for name, s in stores.items():
            rng = np.random.default_rng(3)
            s.set_hot({"a": np.arange(4)})
            for step in range(60):
                ids = np.unique(np.concatenate([rng.integers(0, 24, 12), rng.integers(1000, 100_000, 20)]))
                if step % 5 == 0:
                    s.prefetch("a", ids)
                s.lookup("a", ids)
                s.apply_gradients("a", ids, torch.from_numpy(rng.normal(0, 1, (len(ids), 4)).astype(np.float32)))
        assert stores["frequency"].tables["a"].cache.refused > 0
        ids = np.unique(np.concatenate([np.arange(24), np.random.default_rng(3).integers(1000, 100_000, 2000)]))
        ref = stores["off"].peek("a", ids)
        for name in ("frequency", "lru"):
            assert torch.equal(stores[name].peek("a", ids), ref), name
    finally:
        for s in stores.values():
            s.close()


def test_a_step_over_two_tables_with_a_rewrite_between_lookup_and_apply_matches_no_cache(tmp_path):
    """The trainer's step: look up every table, then apply each. Each table keeps its own lookup's probe
    (rows the admission refused are written back from it without a second read); a row rewritten
    between the lookup and the apply (upsert) must keep the rewrite, as with no cache at all."""
    tables = {"a": 4, "b": 3}
    stores = {adm: EmbeddingStore(StoreSpec(str(tmp_path / adm), tables, shards=2, hot_capacity_rows=4,
                                            host_cache_rows=rows,
                                            cache_admission=adm))
              for adm, rows in (("frequency", 64), ("off", 0))}
    try:
        for s in stores.values():
            rng = np.random.default_rng(5)
            for step in range(40):
                ids = {t: np.unique(np.concatenate([rng.integers(0, 10, 6), rng.integers(1000, 50_000, 12)]))
                       for t in tables}
                for t, i in ids.items():
                    s.lookup(t, i)
                if step % 3 == 0:  # one of table a's one-off ids (mostly refused by the tiny cache) rewritten
                    s.upsert_rows("a", ids["a"][-1:], rng.normal(0, 1, (1, 4)).astype(np.float32))
                for t, i in ids.items():
                    s.apply_gradients(t, i, torch.from_numpy(rng.normal(0, 1, (len(i), tables[t])).astype(np.float32)))
        assert stores["frequency"].tables["a"].cache.refused > 0
        for t in tables:
            ids = np.arange(0, 50_000)
            assert torch.equal(stores["frequency"].peek(t, ids), stores["off"].peek(t, ids)), t
    finally:
        for s in stores.values():
            s.close()


def test_each_admitted_row_displaces_one_less_frequent_candidate():
    """A full cache admits a missed row only by beating, count against count, the least often seen of its
    least recently used rows; it evicts exactly one row per row admitted, never a row seen more often."""
    spilled = []
    c = HostCache(100, record_dtype(4), lambda ids, recs: spilled.append(ids.copy()), admission="frequency")
    assert c.evict_batch == 12  # candidates: the 24 least recently used rows

    def put(ids):
        ids = np.asarray(ids, dtype=np.int64)
        c.record(ids)
        return c.insert(ids, np.zeros(len(ids), dtype=c.rec.dtype), np.zeros(len(ids), bool), dirty=True)

    put(np.arange(50, 74))   # the oldest 24 rows: the eviction candidates
    put(np.arange(74, 100))
    put(np.arange(0, 50))
    for _ in range(4):
        c.record(np.arange(50, 60, dtype=np.int64))  # 50..59 seen 5 times, 60..73 once
    assert len(c) == 100 and not spilled

    often = np.arange(1000, 1010, dtype=np.int64)
    for _ in range(2):
        c.record(often)                                   # seen 3 times with the insert below
    once = np.arange(2000, 2005, dtype=np.int64)          # seen once: refused (the doorkeeper)
    slots = put(np.concatenate([often, once]))
    assert (slots[:10] >= 0).all() and (slots[10:] == -1).all()
    assert len(c) == 100 and c.evicted == 10 and c.refused == 5
    cached = c.find(np.arange(100, dtype=np.int64)) >= 0
    assert cached[50:60].all()            # the candidates seen 5 times stayed
    assert (~cached[60:74]).sum() == 10   # ten of those seen once left, one for each row admitted
    assert cached[:50].all() and cached[74:].all()
    # the refused rows and the evicted ones (all dirty) were written back, nothing dropped
    gone = np.concatenate(spilled)
    assert set(gone.tolist()) == set(once.tolist()) | set(np.arange(60, 74)[~cached[60:74]].tolist())
