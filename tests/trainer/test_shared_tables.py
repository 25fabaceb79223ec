"""Per-field embedding widths and shared tables in the store, the hot set, the budget, checkpoints,
resharding and the group's row exchange: every table once, at its own width, keyed by table name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.app.wiring import trainer_settings
from streamrec.embedding_store import EmbeddingStore, StoreMismatchError
from streamrec.foundation import EventBatch, JaggedIds, hot_budget, hot_row_bytes
from streamrec.foundation.model_config import FieldSpec
from streamrec.trainer.hotset import make_hot_source
from streamrec.trainer.reshard import reshard_into
from streamrec.trainer.resume import open_store, restore_point
from streamrec.trainer.sharding import owner_of

from ..conftest import small_config
from ..helpers.group import run_group

CPU = torch.device("cpu")


def shared_config(tmp_path, user_dim: int = 8, **overrides):
    """user + last_clicked_user share table ``user`` (dim ``user_dim``); item has its own of dim 32."""
    cfg = small_config(tmp_path, **overrides)
    cfg.model.fields = [FieldSpec("user", dim=user_dim), FieldSpec("last_clicked_user", dim=user_dim, table="user"),
                        FieldSpec("item", dim=32)]
    return cfg


def batch(users, last, items) -> EventBatch:
    n = len(users)
    return EventBatch(ts=np.arange(n, dtype=np.int64), labels=np.zeros(n, np.float32), dense=np.zeros((n, 3), np.float32),
                      sparse={"user": JaggedIds.from_lists([[u] for u in users]),
                              "last_clicked_user": JaggedIds.from_lists([[u] for u in last]),
                              "item": JaggedIds.from_lists([[i] for i in items])})


def test_the_store_holds_each_table_once_at_its_own_width_and_round_trips_a_checkpoint(tmp_path):
    cfg = shared_config(tmp_path)
    assert cfg.model.tables == {"user": 8, "item": 32}
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU)
    try:
        assert {n: t.dim for n, t in store.tables.items()} == {"user": 8, "item": 32}
        ids = np.array([1, 2, 3], np.int64)
        assert tuple(store.lookup("user", ids).shape) == (3, 8)
        assert tuple(store.lookup("item", ids).shape) == (3, 32)
        with pytest.raises(Exception, match="unknown table 'last_clicked_user'"):
            store.lookup("last_clicked_user", ids)
        store.lookup("user", ids)
        store.apply_gradients("user", ids, torch.ones(3, 8))
        store.lookup("item", ids)
        store.apply_gradients("item", ids, torch.full((3, 32), 0.5))
        store.set_hot({"user": np.array([1]), "item": np.array([2])})
        store.lookup("user", np.array([1]))
        store.apply_gradients("user", np.array([1]), torch.ones(1, 8))  # a hot row's update is in the checkpoint too
        want = {t: store.peek(t, ids).clone() for t in ("user", "item")}
        store.checkpoint(str(tmp_path / "ck"))
    finally:
        store.close()
    back = EmbeddingStore.restore(str(tmp_path / "ck"), path=str(tmp_path / "live2"), tables=dict(cfg.model.tables),
                                  hot_capacity_rows=10)
    try:
        assert {n: t.dim for n, t in back.tables.items()} == {"user": 8, "item": 32}
        for t, v in want.items():
            torch.testing.assert_close(back.peek(t, ids), v, rtol=0, atol=0)
        assert back.tables["user"].hot.slot_ids().tolist() == [1] and back.tables["item"].hot.slot_ids().tolist() == [2]
    finally:
        back.close()


def test_the_default_config_gives_one_table_per_field_at_embedding_dim(tmp_path):
    """Old checkpoints name every table as its field at one width: the default config asks for exactly those."""
    cfg = small_config(tmp_path)
    assert cfg.model.tables == {f: cfg.model.embedding_dim for f in cfg.model.field_names}
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU)
    try:
        assert {n: t.dim for n, t in store.tables.items()} == cfg.model.tables
        assert store.hot_capacity_rows == cfg.hot.budget_rows and store.hot_capacity_bytes == 0
    finally:
        store.close()


def test_a_byte_budget_charges_each_table_s_own_width(tmp_path):
    cfg = shared_config(tmp_path, **{"hot.budget_bytes": hot_row_bytes(8) * 4 + hot_row_bytes(32) * 1})
    b = hot_budget(cfg.hot, cfg.model)
    assert b.row_bytes == {"user": 36, "item": 132}
    assert b.rows == b.bytes // 36  # the most rows the bytes buy: all of the narrowest table
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU)
    try:
        assert store.hot_capacity_bytes == b.bytes
        store.set_hot({"user": np.arange(4), "item": np.arange(1)})  # exactly the budget
        with pytest.raises(Exception, match="hot_capacity_bytes"):
            store.set_hot({"user": np.arange(2), "item": np.arange(2)})  # fewer rows, more bytes
        assert len(store.tables["item"].hot) == 1  # the refused set changed nothing
    finally:
        store.close()


def test_the_hot_rows_of_a_shared_table_are_counted_from_both_fields(tmp_path):
    """Id 7 is the hottest user only when its lookups as ``user`` and as ``last_clicked_user`` add up."""
    cfg = shared_config(tmp_path, **{"hot.budget_rows": 2, "trainer.hot_source": "sample",
                                     "trainer.hot_sample_events": 10})
    src = make_hot_source(cfg.trainer, cfg.model, cfg.kafka, hot_budget(cfg.hot, cfg.model), None)
    # user 5: 6 lookups as user; user 7: 4 as user + 4 as last_clicked_user; item 9: 5
    src.observe(batch([5] * 6 + [7] * 4, [7] * 4 + [1, 2, 3, 4, 6, 8], [9] * 5 + [10, 11, 12, 13, 14]))
    upd = src.poll()
    assert upd is not None and set(upd.tables) == {"user", "item"}
    assert upd.tables["user"].tolist() == [5, 7] and upd.tables["item"].tolist() == []
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU)
    try:
        store.set_hot(upd.tables)  # the set is keyed as the store is
        assert sorted(store.tables["user"].hot.slot_ids().tolist()) == [5, 7]
    finally:
        store.close()


def test_restoring_a_checkpoint_of_another_width_is_refused_naming_the_table(tmp_path):
    wide = shared_config(tmp_path, user_dim=16)
    store = EmbeddingStore.from_sections(wide.store, wide.model, hot_budget(wide.hot, wide.model), CPU)
    store.lookup("user", np.array([1]))
    store.apply_gradients("user", np.array([1]), torch.ones(1, 16))
    ck = tmp_path / "ckpt" / "ckpt-000000001"
    ck.mkdir(parents=True)
    store.checkpoint(str(ck / "store"))
    store.close()
    (ck / "state.json").write_text("{}")
    torch.save({}, ck / "dense.pt")
    narrow = shared_config(tmp_path, user_dim=8)
    with pytest.raises(StoreMismatchError) as e:
        open_store(trainer_settings(narrow), CPU, ck)
    msg = str(e.value)
    assert "\n" not in msg and "table 'user' has dim 16 in the checkpoint, the config asks for dim 8" in msg
    assert "item" not in msg  # only the table that differs is named
    # the config's fault, not the checkpoint's: resume stops with the error and keeps the checkpoint
    refused: list[str] = []
    with pytest.raises(StoreMismatchError, match="table 'user' has dim 16"):
        restore_point(lambda at: open_store(trainer_settings(narrow), CPU, at), narrow.store.path, str(tmp_path / "ckpt"), refused)
    assert ck.exists() and not list((tmp_path / "ckpt").glob("corrupt-*")) and refused == []
    # the width it was written with restores it
    back = open_store(trainer_settings(wide), CPU, ck)
    try:
        assert back.tables["user"].dim == 16
    finally:
        back.close()


def test_resharding_moves_each_table_s_rows_once_by_table_owner(tmp_path):
    cfg = shared_config(tmp_path)
    src = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU, path=str(tmp_path / "src-live"))
    ids = np.arange(1, 201, dtype=np.int64)
    for t, d in cfg.model.tables.items():
        src.lookup(t, ids)
        src.apply_gradients(t, ids, torch.arange(len(ids) * d, dtype=torch.float32).reshape(len(ids), d) / 1000)
    want = {t: src.peek(t, ids).clone() for t in cfg.model.tables}
    (tmp_path / "old").mkdir()
    src.checkpoint(str(tmp_path / "old" / "store"))  # a plain trainer's shard: one store, no checksums to verify
    src.close()
    seen = {t: [] for t in cfg.model.tables}
    for rank in range(2):
        dst = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), CPU, path=str(tmp_path / f"r{rank}"))
        try:
            taken = reshard_into(dst, [tmp_path / "old"], rank, 2)
            got = {t: set() for t in cfg.model.tables}
            for t, i, _ in dst.export_records():
                got[t] |= set(i.tolist())
            for t in cfg.model.tables:
                mine = ids[owner_of(t, ids, 2) == rank]
                assert 0 < len(mine) < len(ids) and taken[t] == len(mine) and got[t] == set(mine.tolist())
                torch.testing.assert_close(dst.peek(t, mine), want[t][np.isin(ids, mine)], rtol=0, atol=0)
                seen[t] += mine.tolist()
        finally:
            dst.close()
    for t in cfg.model.tables:
        assert sorted(seen[t]) == ids.tolist()  # every row landed exactly once


def _exchange_mixed_widths(rank, world, cfg, tmp):
    """A RowExchange over tables of widths 8, 32 and 8: rows come back exact at each table's width, and each
    owner gets the sum of both ranks' gradients for its rows."""
    from streamrec.trainer.sharding import RowExchange

    dims = {"user": 8, "item": 32, "tags": 8}
    applied = {}

    def lookup(table, ids):
        d = dims[table]
        return torch.from_numpy(np.stack([ids * 0.5 + k + 100 * d for k in range(d)], 1).astype(np.float32))

    def apply_gradients(table, ids, grads):
        assert grads.shape == (len(ids), dims[table])
        for i, g in zip(ids.tolist(), grads.numpy()):
            assert owner_of(table, np.array([i]), world)[0] == rank
            applied[f"{table}:{i}"] = applied.get(f"{table}:{i}", 0) + float(g.sum())

    ex = RowExchange(dims, None, lookup, apply_gradients, rank, world)
    uniq = {"user": np.arange(1, 60, dtype=np.int64) * (rank + 1), "item": np.arange(5, 40, dtype=np.int64),
            "tags": np.zeros(0, np.int64) if rank else np.arange(3, dtype=np.int64)}
    rows, sizes = ex.fetch(uniq, 10 + rank)
    for t, u in uniq.items():
        np.testing.assert_array_equal(rows[t].numpy(), lookup(t, u).numpy())
    ex.give_back({t: torch.full_like(r, 1.0 + rank) for t, r in rows.items()})
    return {"sizes": sizes.tolist(), "applied": applied}


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_the_row_exchange_carries_each_table_at_its_own_width(tmp_path):
    ranks = run_group(2, small_config, tmp_path, _exchange_mixed_widths, timeout=240.0)
    assert [r["sizes"] for r in ranks] == [[10, 11], [10, 11]]
    applied = {**ranks[0]["applied"], **ranks[1]["applied"]}
    assert not set(ranks[0]["applied"]) & set(ranks[1]["applied"])  # one owner per row
    dims = {"user": 8, "item": 32, "tags": 8}
    want = {}
    for rank in range(2):
        for t, u in {"user": np.arange(1, 60) * (rank + 1), "item": np.arange(5, 40),
                     "tags": [] if rank else np.arange(3)}.items():
            for i in np.asarray(u, dtype=np.int64).tolist():
                want[f"{t}:{i}"] = want.get(f"{t}:{i}", 0) + (1.0 + rank) * dims[t]
    assert applied == pytest.approx(want)
