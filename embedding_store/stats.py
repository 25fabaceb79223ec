"""The store's counters, as one flat dict (logged by the trainer, exported by the benches)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store_parts import StoreParts
    from .table import Table


def stats(store: StoreParts) -> dict:
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
        "epoch": store.epoch,
        "device": str(store.device),
        "admission_refused": sum(t.admission.refused for t in store.tables.values() if t.admission is not None),
        "admission_admitted": sum(t.admission.admitted for t in store.tables.values() if t.admission is not None),
        "evicted": sum(t.evicted for t in store.tables.values()),
        "tables": {t.name: table_stats(t) for t in store.tables.values()},
    }


def table_stats(t: Table) -> dict:
    """One table's lean-table figures: ids read as unadmitted (one per step), ids admitted, rows evicted,
    stored rows after the last sweep (-1: not swept) and the admission counters' bytes."""
    a = t.admission
    return {"admission_refused": a.refused if a is not None else 0,
            "admission_admitted": a.admitted if a is not None else 0,
            "evicted": t.evicted, "rows_at_sweep": -1 if t.rows_at_sweep is None else t.rows_at_sweep,
            "admission_bytes": a.nbytes() if a is not None else 0}
