"""The fused step (every table in one pass) against the per-table ``train_step`` it replaces: the
same scores, dense weights and rows, bit for bit when no two fields share a table, within 1e-6
when they do (module doc of ``trainer/fused_step.py``); its fixed-shape unique; its one-copy staging."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, KeyedJaggedIds, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.model import build_model
from streamrec.trainer.fused_step import FusedStep, unique_fixed
from streamrec.trainer.staging import Stager, layout, pack, unpack
from streamrec.trainer.dense_optimizers import dense_optimizer
from streamrec.trainer.step import NonFiniteStep, train_step
from streamrec.trainer.step_types import RowSource
from tests.conftest import small_config

BS = 128


def _pair(tmp_path, hot_share: float, **over):
    """Two identical (store, model, optimizer) set-ups and a stream; ``hot_share`` of each table's ids hot."""
    cfg = small_config(tmp_path / "cfg", **{"trainer.batch_size": BS, "hot.budget_rows": 10_000, **over})
    batch = next(SyntheticStream(cfg).batches(BS * 12))
    batch = batch.take(np.arange(BS * 12))
    sides = []
    for name in ("per_table", "fused"):
        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path / name))
        if hot_share:
            hot = {}
            for f, t in cfg.model.field_tables.items():
                ids = np.unique(batch.sparse[f].values)
                hot[t] = np.union1d(hot.get(t, np.zeros(0, np.int64)), ids[: int(len(ids) * hot_share)])
            store.set_hot(hot)
        model = build_model(cfg.model)
        opt = dense_optimizer(model, cfg.trainer.dense_optimizer, cfg.trainer.dense_lr)
        sides.append((store, model, opt))
    return cfg, batch, sides


def _train_both(cfg, batch, sides, fixed_shapes=False):
    (s1, m1, o1), (s2, m2, o2) = sides
    fused = FusedStep(m2, o2, cfg.model, s2, torch.device("cpu"), fixed_shapes=fixed_shapes)
    out = []
    for lo in range(0, len(batch), BS):
        sub = batch.take(np.arange(lo, lo + BS))
        a = train_step(m1, o1, sub, cfg.model, s1.lookup, s1.apply_gradients, torch.device("cpu"))
        b = fused.run(fused.prepare(sub))
        out.append((a, b))
    return out


def _rows(store, cfg, batch):
    return {t: store.peek(t, np.unique(np.concatenate([batch.sparse[f].values for f in fs]))).numpy()
            for t, fs in _table_fields(cfg).items()}


def _table_fields(cfg):
    out = {}
    for f, t in cfg.model.field_tables.items():
        out.setdefault(t, []).append(f)
    return out


@pytest.mark.parametrize("hot_share", [0.0, 0.5, 1.0], ids=["all-cold", "mixed", "all-hot"])
def test_the_fused_step_equals_the_per_table_step_bit_for_bit(tmp_path, hot_share):
    cfg, batch, sides = _pair(tmp_path, hot_share)
    for a, b in _train_both(cfg, batch, sides):
        assert np.array_equal(a, b)
    (s1, m1, _), (s2, m2, _) = sides
    for (k, p1), p2 in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(p1, p2), k
    r1, r2 = _rows(s1, cfg, batch), _rows(s2, cfg, batch)
    for t in r1:
        assert np.array_equal(r1[t], r2[t]), t
    if hot_share:  # the arena's rows were updated in place and are marked for write-back
        assert any(t.hot.dirty.any() for t in s2.tables.values())
    for s, _, _ in sides:
        s.close()


def test_fixed_shapes_train_the_same_rows_as_exact_shapes(tmp_path):
    """The CUDA form of the step (a padded unique whose padding updates the scratch row) on a CPU."""
    cfg, batch, sides = _pair(tmp_path, 0.5)
    (s1, m1, o1), (s2, m2, o2) = sides
    exact = FusedStep(m1, o1, cfg.model, s1, torch.device("cpu"), fixed_shapes=False)
    fixed = FusedStep(m2, o2, cfg.model, s2, torch.device("cpu"), fixed_shapes=True)
    for lo in range(0, len(batch), BS):
        sub = batch.take(np.arange(lo, lo + BS))
        assert np.array_equal(exact.run(exact.prepare(sub)), fixed.run(fixed.prepare(sub)))
    r1, r2 = _rows(s1, cfg, batch), _rows(s2, cfg, batch)
    for t in r1:
        assert np.array_equal(r1[t], r2[t]), t
    for s, _, _ in sides:
        s.close()


def test_a_shared_table_matches_within_float_rounding(tmp_path):
    over = {"model.fields": [{"name": "user", "table": "ids"}, {"name": "item", "table": "ids"},
                             {"name": "tags"}]}
    cfg, batch, sides = _pair(tmp_path, 0.5, **over)
    for a, b in _train_both(cfg, batch, sides):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    r1, r2 = _rows(sides[0][0], cfg, batch), _rows(sides[1][0], cfg, batch)
    for t in r1:
        np.testing.assert_allclose(r1[t], r2[t], rtol=1e-5, atol=1e-6)
    for s, _, _ in sides:
        s.close()


def test_a_non_finite_step_changes_nothing_and_names_the_events(tmp_path):
    cfg, batch, sides = _pair(tmp_path, 0.5)
    store, model, opt = sides[1]
    fused = FusedStep(model, opt, cfg.model, store, torch.device("cpu"))
    sub = batch.take(np.arange(BS))
    sub.dense[3, 0] = np.inf
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows_before = _rows(store, cfg, batch)
    with pytest.raises(NonFiniteStep) as e:
        fused.run(fused.prepare(sub))
    assert list(e.value.rows) == [3]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for t, r in _rows(store, cfg, batch).items():
        assert np.array_equal(r, rows_before[t]), t
    for s, _, _ in sides:
        s.close()


def test_the_store_and_the_in_memory_baseline_are_row_sources(tmp_path):
    from streamrec.trainer.reference import MemoryDLRM

    cfg = small_config(tmp_path)
    with EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu") as store:
        assert isinstance(store, RowSource)
    vocab = {f: np.arange(10, dtype=np.int64) for f in cfg.model.field_names}
    assert isinstance(MemoryDLRM(cfg.model, cfg.trainer, cfg.store, vocab), RowSource)


def test_unique_fixed_pads_with_the_fill_and_inverts():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 500):
        x = torch.from_numpy(rng.integers(0, 40, n))
        u, inv = unique_fixed(x, fill=99)
        ref = torch.unique(x)
        assert len(u) == n
        assert torch.equal(u[: len(ref)], ref) and bool((u[len(ref):] == 99).all())
        assert torch.equal(u[inv], x)


def test_staging_packs_every_array_into_one_buffer_and_reads_them_back():
    arrays = [np.arange(5, dtype=np.int64), np.ones((3, 2), np.float32), np.array([True, False]),
              np.zeros((0, 4), np.float32), np.arange(3, dtype=np.float32)]
    offs, size = layout(arrays)
    assert all(o % 8 == 0 for o in offs)
    buf = np.zeros(size, np.uint8)
    back = unpack(torch.from_numpy(buf), arrays, pack(arrays, buf))
    for a, t in zip(arrays, back):
        assert t.shape == a.shape and np.array_equal(t.numpy(), a)
    staged = Stager(torch.device("cpu"), packed=True).to_device(arrays)
    for a, t in zip(arrays, staged):
        assert np.array_equal(t.numpy(), a)


def test_keyed_jagged_ids_lay_every_key_out_in_one_pair_of_arrays(tmp_path):
    cfg = small_config(tmp_path)
    b = next(SyntheticStream(cfg).batches(50))
    b = b.take(np.arange(50))
    kjt = KeyedJaggedIds.from_batch(b, ["item", "tags"])
    assert len(kjt.offsets) == 2 * 50 + 1 and kjt.offsets[-1] == len(kjt.values)
    assert np.array_equal(kjt.values_of("tags"), b.sparse["tags"].values)
    for i in range(50):  # bag k = key k // B, event k % B
        bag = kjt.values[kjt.offsets[50 + i]:kjt.offsets[50 + i + 1]]
        assert np.array_equal(bag, b.sparse["tags"].row(i))
    empty = KeyedJaggedIds.from_batch(EventBatch.empty(cfg.model.dense_dim, cfg.model.field_names), ["item"])
    assert len(empty.values) == 0 and list(empty.offsets) == [0]


def test_the_hot_index_finds_every_hot_row_and_nothing_else():
    from streamrec.embedding_store.hot_index import HotIndex

    rng = np.random.default_rng(1)
    ids = np.unique(rng.integers(-2**62, 2**62, 3000))
    codes = rng.integers(0, 3, len(ids)).astype(np.int16)
    slots = rng.permutation(len(ids))
    q = rng.permutation(len(ids))
    for compiled in (False, True):  # the numpy probe and the numba kernel give the same answers
        idx = HotIndex([11, 22, 33], codes, ids, slots, compiled=compiled)
        assert np.array_equal(idx.find(codes[q], ids[q]), slots[q])
        # the same id under another table, and ids never inserted, are not hot
        assert (idx.find((codes + 1) % 3, ids) == -1).all()
        assert (idx.find(codes, ids + 1) == -1).all()
    assert len(HotIndex([1], np.zeros(0, np.int16), np.zeros(0, np.int64), np.zeros(0, np.int64)).find(
        np.zeros(4, np.int16), np.arange(4))) == 4


def test_tables_of_several_widths_pool_in_field_order_bit_for_bit(tmp_path):
    """Fields of two widths interleaved (8, 4, 8): each width pools in one call, and the model still gets
    every field's columns in field order."""
    over = {"model.fields": [{"name": "user"}, {"name": "item", "dim": 4}, {"name": "tags"}],
            "model.architecture": "mlp"}
    cfg, batch, sides = _pair(tmp_path, 0.5, **over)
    for a, b in _train_both(cfg, batch, sides):
        assert np.array_equal(a, b)
    r1, r2 = _rows(sides[0][0], cfg, batch), _rows(sides[1][0], cfg, batch)
    for t in r1:
        assert np.array_equal(r1[t], r2[t]), t
    for s, _, _ in sides:
        s.close()
