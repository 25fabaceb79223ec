"""A store read through a view is left exactly as it was: a checkpoint read by one process (a trainer rank
resharding it) is verified against its checksums by another at the same moment, and an open in place
rewrites a file those checksums cover."""

from __future__ import annotations

import os

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec, remove_view, store_view


def _files(root):
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (os.stat(p).st_mtime_ns, fh.read())
    return out


def _checkpointed_store(tmp_path):
    with EmbeddingStore(StoreSpec(str(tmp_path / "live"), {"a": 4}, shards=2)) as s:
        s.apply_gradients("a", np.arange(300, dtype=np.int64), torch.ones(300, 4))
        s.checkpoint(str(tmp_path / "ckpt" / "store"))
    return tmp_path / "ckpt" / "store"


def test_an_open_in_place_rewrites_a_file_and_a_view_leaves_every_file_as_it_was(tmp_path):
    store = _checkpointed_store(tmp_path)
    before = _files(store)
    assert any(name.endswith("rocksdict-config.json") for name in before)
    views = [store_view(store, tmp_path / "readers") for _ in range(2)]  # two readers at once, as a group's ranks
    readers = [EmbeddingStore(StoreSpec(str(v), {"a": 4}, shards=2, read_only=True)) for v in views]
    try:
        for r in readers:
            assert sum(len(i) for _t, i, _recs in r.export_records()) == 300
        assert _files(store) == before
    finally:
        for r, v in zip(readers, views):
            r.close()
            remove_view(v)
    assert _files(store) == before and os.listdir(tmp_path / "readers") == []
    # the reason for the view: the same open in place changes the store's files
    EmbeddingStore(StoreSpec(str(store), {"a": 4}, shards=2, read_only=True)).close()
    assert _files(store) != before
