"""A read-only open of a store writes nothing into its directory: a checkpoint read by one process (a
trainer rank resharding it) is verified against its checksums by another at the same moment."""

from __future__ import annotations

import os

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec


def _files(root):
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (st.st_mtime_ns, fh.read())
    return out


def test_a_read_only_open_leaves_every_file_of_the_store_as_it_was(tmp_path):
    ids = np.arange(300, dtype=np.int64)
    with EmbeddingStore(StoreSpec(str(tmp_path / "live"), {"a": 4}, shards=2)) as s:
        s.apply_gradients("a", ids, torch.ones(300, 4))
        s.checkpoint(str(tmp_path / "ckpt" / "store"))
    before = _files(tmp_path / "ckpt")
    assert any(name.endswith("rocksdict-config.json") for name in before)  # the file rocksdict rewrites on open
    readers = [EmbeddingStore(StoreSpec(str(tmp_path / "ckpt" / "store"), {"a": 4}, shards=2, read_only=True))
               for _ in range(2)]  # two readers at once, as the ranks of a resharding group
    try:
        for r in readers:
            assert sum(len(i) for _t, i, _recs in r.export_records()) == 300
        assert _files(tmp_path / "ckpt" / "store") == {k[len("store/"):]: v for k, v in before.items()}
    finally:
        for r in readers:
            r.close()
    assert _files(tmp_path / "ckpt") == before  # and the readers' views are gone
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["store"]
