"""Resharding: a group restarted with a different number of ranks moves every row,
with its Adagrad state, to its owner under the new world size.

Each new rank reads every shard of the last group checkpoint (read-only, after
checking its checksums) and keeps the rows :func:`owner_of` gives it. No rank
talks to another: each computes the same owners, so every row lands exactly once.
A plain trainer's checkpoint (one store, no group manifest) is a one-shard group,
so ``1 -> N`` and ``N -> 1`` are the same operation.

All old shards must be readable from every new rank: one host, or a checkpoint
directory on a shared filesystem.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from streamrec.foundation import StreamrecError

from .checkpoint import STORE, verify_checkpoint
from .sharding import owner_of

log = logging.getLogger(__name__)


def rank_dir(root: str | Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its shard checkpoints (``<checkpoint_dir>/rank-NNN``)."""
    return Path(root) / f"rank-{rank:03d}"


def shard_checkpoints(root: str | Path, manifest_dir: Path, state: Mapping[str, Any]) -> list[Path]:
    """The shard checkpoint directories of one group checkpoint (a plain checkpoint: itself)."""
    if "world" not in state:
        return [manifest_dir]
    return [rank_dir(root, q) / manifest_dir.name for q in range(int(state["world"]))]


def reshard_into(store, sources: list[Path], rank: int, world: int) -> dict[str, int]:
    """Import into ``store`` (fresh, no hot set yet) the rows of ``sources`` that ``rank`` owns among ``world``.

    Returns per-table counts of rows taken. Raises :class:`StreamrecError` naming a shard that is
    missing or does not verify (the caller falls back to an older checkpoint)."""
    from streamrec.embedding_store import EmbeddingStore, StoreSpec, remove_view, store_view

    taken: dict[str, int] = {}
    for src in sources:
        if not (src / STORE).is_dir():
            raise StreamrecError(f"resharding needs every shard of the checkpoint, and {src / STORE} is missing "
                                 "(on several hosts, put trainer.checkpoint_dir on a filesystem they share)")
        verify_checkpoint(src)
        # every rank reads every shard while the others verify it: each reads through a view of its own, beside
        # its own store, since an open in place rewrites a file the checksums cover (embedding_store/reader_view.py)
        view = store_view(src / STORE, Path(store.path).parent)
        try:
            old = EmbeddingStore(StoreSpec(str(view), tables={t: store.tables[t].dim for t in store.tables},
                                           shards=_shards_of(src / STORE), seed=store.seed, read_only=True))
        except BaseException:
            remove_view(view)
            raise
        try:
            for table, ids, recs in old.export_records():
                if table not in store.tables:
                    continue
                mine = owner_of(table, ids, world) == rank
                if mine.any():
                    order = np.argsort(ids[mine], kind="stable")
                    store.import_records(table, ids[mine][order], recs[mine][order])
                    taken[table] = taken.get(table, 0) + int(mine.sum())
        finally:
            old.close()
            remove_view(view)
    store.flush()
    log.info("resharded into rank %d of %d: %s rows from %d shard(s)", rank, world, taken, len(sources))
    return taken


def _shards_of(store_dir: Path) -> int:
    import json

    with open(store_dir / "manifest.json") as f:
        return int(json.load(f)["shards"])
