"""Resharding a group checkpoint to another world size (real RocksDB shards): every row, with its
Adagrad state, lands at exactly one new owner, unchanged; a shard that does not verify is named."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.foundation import StreamrecError, hot_budget
from streamrec.trainer.checkpoint import CheckpointError, write_checkpoint
from streamrec.trainer.reshard import rank_dir, reshard_into, shard_checkpoints
from streamrec.trainer.sharding import owner_of

from ..conftest import small_config


def _records(store) -> dict[tuple[str, int], tuple]:
    out = {}
    for table, ids, recs in store.export_records():
        for i, r in zip(ids.tolist(), recs):
            key = (table, i)
            assert key not in out, f"{key} stored twice"
            out[key] = (r["w"].copy(), r["acc"].copy())
    return out


def _group_checkpoint(tmp_path, world: int, seq: int = 1):
    """A checkpoint of a ``world``-rank group whose ranks trained their own rows; returns (root, manifest, rows)."""
    cfg = small_config(tmp_path)
    root = tmp_path / "ckpt"
    rng = np.random.default_rng(0)
    everything = {}
    for r in range(world):
        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                             "cpu", path=str(tmp_path / f"live-{world}-{r}"))
        for f in cfg.model.field_names:
            ids = np.unique(rng.integers(0, 5000, 800))
            ids = ids[owner_of(f, ids, world) == r]
            store.lookup(f, ids)
            store.apply_gradients(f, ids, __import__("torch").from_numpy(rng.normal(size=(len(ids), 8)).astype("f4")))
        store.set_hot({"user": np.asarray([i for i in range(50) if owner_of("user", np.asarray([i]), world)[0] == r])})

        def write_store(d, store=store):
            return {"epoch": store.checkpoint(d)}

        write_checkpoint(rank_dir(root, r), seq, {"rank": r, "world": world}, {}, write_store)
        store.close()
        ro = EmbeddingStore(StoreSpec(str(rank_dir(root, r) / f"ckpt-{seq:09d}" / "store"),
                                      tables={f: 8 for f in cfg.model.field_names},
                                      shards=cfg.store.shards, read_only=True))
        everything.update(_records(ro))
        ro.close()
    manifest = {"world": world}
    return cfg, root, root / f"ckpt-{seq:09d}", manifest, everything


@pytest.mark.parametrize("old,new", [(2, 3), (3, 1)])
def test_every_row_and_its_adagrad_state_lands_once(tmp_path, old, new):
    cfg, root, ckpt, manifest, before = _group_checkpoint(tmp_path, old)
    assert len(before) > 1000
    after = {}
    for r in range(new):
        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                             "cpu", path=str(tmp_path / f"new-{r}"))
        reshard_into(store, shard_checkpoints(root, ckpt, manifest), r, new)
        got = _records(store)
        for table, i in got:
            assert owner_of(table, np.asarray([i]), new)[0] == r  # only rows this rank owns
            assert (table, i) not in after, "a row landed on two ranks"
        after.update(got)
        store.close()
        assert not list(tmp_path.glob(".view-*")), "a rank's view of the shards it read is left behind"
    assert after.keys() == before.keys()  # none lost, none duplicated
    for k, (w, acc) in before.items():
        np.testing.assert_array_equal(after[k][0], w)
        np.testing.assert_array_equal(after[k][1], acc)  # the optimizer state moved with the row
    assert any(acc.any() for _w, acc in before.values())


def test_a_corrupt_or_missing_shard_is_named(tmp_path):
    cfg, root, ckpt, manifest, _ = _group_checkpoint(tmp_path, 2)
    sst = sorted((rank_dir(root, 1) / ckpt.name / "store").rglob("*.sst"))[0]
    data = bytearray(sst.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sst.write_bytes(bytes(data))
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path / "new"))
    with pytest.raises(CheckpointError, match=sst.name):
        reshard_into(store, shard_checkpoints(root, ckpt, manifest), 0, 3)
    import shutil

    shutil.rmtree(rank_dir(root, 1) / ckpt.name)
    with pytest.raises(StreamrecError, match="resharding needs every shard"):
        reshard_into(store, shard_checkpoints(root, ckpt, manifest), 0, 3)
    store.close()
