"""The store's counters, as one flat dict (logged by the trainer, exported by the benches)."""

from __future__ import annotations


def stats(store) -> dict:
    hot_rows = sum(len(t.hot) for t in store.tables.values())
    total = store.hot_hits + store.cold_hits
    caches = [t.cache for t in store.tables.values() if t.cache is not None]
    return {
        "cache_rows": sum(len(c) for c in caches),
        "cache_hits": sum(c.hits for c in caches),
        "cache_misses": sum(c.misses for c in caches),
        "cache_dirty": sum(c.dirty_count() for c in caches),
        "cache_evicted": sum(c.evicted for c in caches),
        "cache_written_back": sum(c.spilled for c in caches),
        "cache_bytes": sum(c.nbytes() for c in caches),
        "hot_rows": hot_rows,
        "cold_rows": store.cold.count_estimate(),
        **store.cold.io_stats(),
        "hot_hits": store.hot_hits,
        "cold_hits": store.cold_hits,
        "hot_hit_rate": store.hot_hits / total if total else 0.0,
        "created": store.created,
        "hot_bytes": sum(t.hot.nbytes() for t in store.tables.values()),
        "epoch": store._epoch,
        "device": str(store.device),
    }
