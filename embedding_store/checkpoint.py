"""Checkpoints of a store: a consistent, durable copy of every row and the hot set.

A checkpoint directory holds the cold tier's copy of every row (hot rows and dirty
cached rows are written back first), ``hot.npz`` (each table's hot ids) and the
store's manifest with the checkpoint's epoch, and ``admission.npz`` (the admission counters) when a table
has them. ``restore`` brings back vectors,
Adagrad state and the hot set bit for bit.
The functions take the store they act on (``store_types.StoreParts``; the class, for ``restore``).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from streamrec.foundation import save_npz

from . import migration, rowpath
from .export import scan_cold
from .cold import read_manifest, write_manifest
from .errors import StoreError, StoreMismatchError
from .store_spec import StoreSpec

if TYPE_CHECKING:
    from .store_parts import StoreParts
    from .store_types import ColdTier

HOT_FILE = "hot.npz"
ADMISSION_FILE = "admission.npz"  # the admission counters (admission.py), when a table has them


def checkpoint(store: StoreParts, path: str) -> int:
    """Write a consistent, durable point to ``path`` (must not exist yet, or be empty); returns its epoch.

    Rows changed after this call carry a higher epoch, so ``changed_rows(since=epoch)``
    gives exactly what changed after it.
    """
    store.check_writable()
    dest = Path(path)
    if dest.exists() and any(dest.iterdir()):
        raise StoreError(f"checkpoint directory {dest} already exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    rowpath.drain(store)
    rowpath.flush_caches(store)
    migration.write_back_hot(store)
    epoch = store.epoch + 1
    store.cold.checkpoint(dest)
    hot = {name: t.hot.slot_ids() for name, t in store.tables.items()}
    save_npz(dest / HOT_FILE, hot)  # not np.savez(**hot): tables may be named "file"
    save_admission(store, dest / ADMISSION_FILE)
    write_manifest(dest, {**store.manifest, "epoch": epoch, "hot_capacity_rows": store.hot_capacity_rows,
                          "hot_capacity_bytes": store.hot_capacity_bytes})
    store.set_epoch(epoch)
    return epoch


def checkpoint_spec(checkpoint_path: str, path: str | None = None, **overrides) -> StoreSpec:
    """The store a checkpoint holds: its manifest's tables, shards, seed and hot capacities, then
    ``overrides`` (:class:`StoreSpec` fields), at ``path`` (default: the checkpoint's directory)."""
    src = Path(checkpoint_path)
    man = _manifest_of(src)
    fields = {"tables": man["tables"], "shards": man["shards"], "seed": man["seed"],
              "hot_capacity_rows": man.get("hot_capacity_rows", 0),
              "hot_capacity_bytes": man.get("hot_capacity_bytes", 0)}
    fields.update({k: v for k, v in overrides.items() if not (k == "tables" and v is None)})
    return StoreSpec(str(src) if path is None else str(path), **fields)


def restore(cls: Callable[[StoreSpec, ColdTier | None], StoreParts], checkpoint_path: str, spec: StoreSpec,
            cold: ColdTier | None = None) -> StoreParts:
    """Open the state of a checkpoint as the store ``spec`` describes (``cls(spec, cold)``).

    Where ``spec.path`` is another directory, the checkpoint is copied there (replacing what is there) and
    the copy becomes the live store; else the checkpoint directory itself is opened and becomes live.
    The checkpoint's hot set is re-promoted (cut to ``hot_capacity_rows`` and ``hot_capacity_bytes``).
    The shard count and the seed are the checkpoint's, whatever ``spec`` says (they are facts of the rows
    it holds). ``spec``'s tables must have the checkpoint's width where the checkpoint has them: a table of
    another width is refused (:class:`StoreMismatchError`, one line naming the table and both widths) before
    anything is copied or opened (:func:`checkpoint_spec` makes a spec of the checkpoint's own).
    """
    src = Path(checkpoint_path)
    man = _manifest_of(src)
    check_dims(src, man, spec.tables)
    spec = replace(spec, shards=man["shards"], seed=man["seed"])  # facts of the stored rows, not choices
    path = spec.path
    if Path(path).resolve() != src.resolve():
        if Path(path).exists():
            shutil.rmtree(path)
        shutil.copytree(src, path)
    store = cls(spec, cold)
    hot_file = Path(path) / HOT_FILE
    if hot_file.exists():
        with np.load(hot_file) as z:
            hot = {k: z[k] for k in z.files if k in store.tables}
        budget = store.hot_capacity_rows  # a smaller hot tier than the checkpoint's keeps a prefix
        nbytes = store.hot_capacity_bytes or None
        for k in hot:
            n = min(len(hot[k]), budget)
            if nbytes is not None:
                n = min(n, nbytes // store.hot_row_bytes(k))
                nbytes -= n * store.hot_row_bytes(k)
            hot[k] = hot[k][:n]
            budget -= n
        if sum(len(v) for v in hot.values()) and not store.read_only:
            store.set_hot(hot)
            for t in store.tables.values():
                t.hot.dirty[:] = False  # identical to the cold tier's copy just read
    return store


def save_admission(store: StoreParts, path: Path) -> None:
    """Every table's counters into ``path`` (npz), beside a checkpoint's rows."""
    arrays = {t.name: t.admission.table for t in store.tables.values() if t.admission is not None}
    if arrays:
        save_npz(path, arrays)


def load_admission(store: StoreParts, path: Path) -> None:
    """Counters saved by :func:`save_admission`; a table whose counters are missing or of another size keeps
    fresh ones and has the ids of its stored rows marked admitted instead (a stored row is never unadmitted)."""
    have: dict[str, np.ndarray] = {}
    if Path(path).exists():
        with np.load(path) as z:
            have = {k: z[k] for k in z.files}
    rebuild = []
    for t in store.tables.values():
        a = t.admission
        if a is None:
            continue
        got = have.get(t.name)
        if got is not None and got.shape == a.table.shape and got.dtype == a.table.dtype:
            a.table[...] = got
        else:
            rebuild.append(t)
    if rebuild:
        names = {t.name for t in rebuild}
        for t, ids, _recs in scan_cold(store):
            if t.name in names:
                t.admission.mark(ids)


def _manifest_of(src: Path) -> dict:
    man = read_manifest(src)
    if man is None:
        raise StoreError(f"{src} is not a store checkpoint (no manifest.json)")
    return man


def check_dims(src, manifest: dict, tables) -> None:
    """Refuse ``tables`` ({name: dim}) whose width differs from the checkpoint's for the same table."""
    have = manifest.get("tables", {})
    bad = [(n, int(have[n]), int(d)) for n, d in tables.items() if n in have and int(have[n]) != int(d)]
    if bad:
        raise StoreMismatchError(f"checkpoint {src} cannot be restored with this config: " + "; ".join(
            f"table {n!r} has dim {old} in the checkpoint, the config asks for dim {new}" for n, old, new in bad))
