"""Rows out of and into a store in bulk: Arrow export of changed rows (snapshots), raw
records with their optimizer state (resharding), full scans of the cold tier, which rows are held,
and deleting rows.
The functions take the store they read or write (``store_types.StoreParts``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch

from . import lookup, rowpath
from .errors import StoreError
from .rows import unpack_records
from .table import Table

if TYPE_CHECKING:
    import pyarrow as pa

    from .store_parts import StoreParts


def changed_rows(store: StoreParts, since: int | None = None) -> Iterator[pa.RecordBatch]:
    """Rows changed after checkpoint epoch ``since`` (None: all rows), as Arrow batches with
    columns ``table`` (string), ``id`` (int64), ``vector`` (fixed_size_list<float32>[dim]).
    Each row comes once, from its owner tier."""
    store.table(next(iter(store.tables)))
    rowpath.drain(store)
    floor = -1 if since is None else int(since)
    for t in store.tables.values():
        h = t.hot
        sel = np.flatnonzero(h.ep > floor)
        if len(sel):
            w = h.w[torch.from_numpy(sel).to(store.device)].cpu().numpy()
            yield _batch(t.name, h.slot_ids()[sel], w)
        if t.cache is not None:  # the cache owns its rows: export them from there
            cids, crecs, cstored = t.cache.items()
            sel = np.flatnonzero(cstored & (crecs["ep"].astype(np.int64) > floor))
            if len(sel):
                yield _batch(t.name, cids[sel], crecs["w"][sel])
    for t, ids, recs in scan_cold(store):
        keep = (recs["ep"].astype(np.int64) > floor) & ~t.hot.mask(ids)
        if t.cache is not None:
            keep &= t.cache.find(ids) < 0
        if keep.any():
            yield _batch(t.name, ids[keep], recs["w"][keep])


def import_records(store: StoreParts, table: str, ids: np.ndarray, records: np.ndarray) -> None:
    """Store rows exactly as exported (vector, Adagrad state, timestamps); ``ids`` unique."""
    store.check_writable()
    t = store.table(table)
    store.probes.lookup.pop(table, None)  # a row written here may be one a remembered lookup refused
    ids = t.checked_unique_ids(ids)
    if records.dtype != t.dtype or len(records) != len(ids):
        raise StoreError(f"{table}: {len(records)} records of {records.dtype} for {len(ids)} ids of {t.dtype}")
    if len(ids) == 0:
        return
    if t.hot.mask(ids).any():
        raise StoreError(f"{table}: import_records into hot rows (import before the hot set is applied)")
    if t.admission is not None:
        t.admission.mark(ids)
    old, found, cslots = rowpath.cold_rows(store, t, ids, touch=False)
    rowpath.store_cold(store, t, ids, records, old, found, cslots)


def peek_held(store: StoreParts, table: str, ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """``peek`` of unique ``ids`` and which of them the store holds a row for (a row never stored, or
    deleted, reads as its init and is not held)."""
    t = store.table(table)
    ids = t.checked_unique_ids(ids)
    rows = lookup.rows(store, table, ids, remember=False)
    held = t.hot.mask(ids)
    cold = ~held
    if cold.any():
        _, found, _ = rowpath.cold_rows(store, t, ids[cold], touch=False)
        held[cold] = found
    return rows, held


def delete_rows(store: StoreParts, table: str, ids: np.ndarray) -> int:
    """Delete the stored rows of unique ``ids`` (not hot); returns how many were stored. Deleted rows read
    as their init again."""
    store.check_writable()
    t = store.table(table)
    ids = t.checked_unique_ids(ids)
    if t.hot.mask(ids).any():
        raise StoreError(f"{table}: delete_rows of hot rows (change the hot set first)")
    rowpath.settle_cold(store, [t])
    old, found = rowpath.fetch(store, t, ids)
    if found.any():
        rowpath.write(store, t, ids[found], None, old[found], found[found])
    return int(found.sum())


def table_sizes(store: StoreParts) -> dict[str, dict[str, int]]:
    """Per table: ``rows`` stored in the cold tier (a full scan; hot rows have their copy there from the last
    checkpoint or demotion on), ``row_bytes`` (their keys and records as stored, before RocksDB's compression)
    and ``disk_bytes``: the store directory's bytes apportioned by each table's share of ``row_bytes`` (RocksDB
    keeps the tables in the same files, so this is an estimate; the tables' sum is the directory's size)."""
    from .rows import KEY_BYTES

    out = {name: {"rows": 0, "row_bytes": 0, "disk_bytes": 0} for name in store.tables}
    for t, ids, packed in _scan_packed(store):
        out[t.name]["rows"] += len(ids)
        out[t.name]["row_bytes"] += sum(len(v) for v in packed) + KEY_BYTES * len(ids)
    total = sum(v["row_bytes"] for v in out.values())
    disk = sum(f.stat().st_size for f in store.path.rglob("*") if f.is_file())
    for v in out.values():
        v["disk_bytes"] = int(round(disk * v["row_bytes"] / total)) if total else 0
    return out


def scan_cold(store: StoreParts) -> Iterator[tuple[Table, np.ndarray, np.ndarray]]:
    """Every row stored in the cold tier, as ``(table, ids, records)`` chunks (a full scan)."""
    for t, ids, packed in _scan_packed(store):
        yield t, ids, unpack_records(packed, t.dtype)


def _scan_packed(store: StoreParts) -> Iterator[tuple[Table, np.ndarray, list[bytes]]]:
    """Every row stored in the cold tier, as ``(table, ids, packed records)`` chunks of one table each."""
    for tags, ids, vals in store.cold.scan():
        for tag in np.unique(tags):
            t = store.table_by_tag(int(tag))
            if t is None:
                continue
            sel = np.flatnonzero(tags == tag)
            yield t, ids[sel], [vals[i] for i in sel.tolist()]


def _batch(table: str, ids: np.ndarray, w: np.ndarray) -> pa.RecordBatch:
    import pyarrow as pa  # here, not at module level: only export needs pyarrow's resident memory

    dim = w.shape[1]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(w, dtype=np.float32).reshape(-1)), dim)
    return pa.RecordBatch.from_arrays(
        [pa.array([table] * len(ids), type=pa.string()), pa.array(ids, type=pa.int64()), vec],
        names=["table", "id", "vector"])
