"""Rows a delta removes: ``deleted.parquet`` (``table`` string, ``id`` int64), present only in a delta that
deletes rows (a table's cap evicted them on the trainer, ``store.max_rows``).

A receiver drops each listed row from the version it builds, before it applies the delta's rows (a row
both deleted and written in one delta is written: the trainer lists only rows it no longer holds when the
delta is cut). A dropped row reads as an unseen id does. ``manifest.deleted`` counts the listed rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import SnapshotError

DELETED = "deleted.parquet"
SCHEMA = pa.schema([("table", pa.string()), ("id", pa.int64())])


def write_deleted(out: Path, deleted: Mapping[str, np.ndarray]) -> int:
    """Write ``deleted`` (ids per table) to ``out / DELETED``; returns how many rows it lists (0: no file)."""
    parts = [(t, np.asarray(ids, dtype=np.int64)) for t, ids in sorted(deleted.items()) if len(ids)]
    n = sum(len(ids) for _, ids in parts)
    if not n:
        return 0
    table = pa.Table.from_arrays([pa.array([t for t, ids in parts for _ in range(len(ids))], pa.string()),
                                  pa.array(np.concatenate([ids for _, ids in parts]), pa.int64())], schema=SCHEMA)
    pq.write_table(table, str(out / DELETED), compression="zstd")
    return n


def iter_deleted(snapshot_dir, manifest) -> Iterator[tuple[str, np.ndarray]]:
    """``(table, unique ids)`` of the rows the snapshot deletes; nothing for a snapshot that deletes none.
    A file not in the schema, or of another row count than the manifest says, is refused."""
    if DELETED not in manifest.files:
        if manifest.deleted:
            raise SnapshotError(f"manifest.deleted is {manifest.deleted} but the snapshot has no {DELETED}")
        return
    try:
        t = pq.read_table(str(Path(snapshot_dir) / DELETED))
    except (OSError, pa.ArrowException) as e:
        raise SnapshotError(f"{DELETED}: unreadable ({str(e)[:200]})", code="INVALID_ARGUMENT") from None
    if t.schema.names != SCHEMA.names or t.schema.field("table").type != pa.string() \
            or t.schema.field("id").type != pa.int64():
        raise SnapshotError(f"{DELETED}: not in its schema (table: string, id: int64), got {t.schema}",
                            code="INVALID_ARGUMENT")
    if t.num_rows != manifest.deleted:
        raise SnapshotError(f"{DELETED}: {t.num_rows} rows, manifest.deleted says {manifest.deleted}",
                            code="INVALID_ARGUMENT")
    tables = np.asarray(t.column("table").to_pylist(), dtype=object)
    ids = t.column("id").to_numpy()
    for name in sorted(set(tables.tolist())):
        yield name, np.unique(ids[tables == name])
