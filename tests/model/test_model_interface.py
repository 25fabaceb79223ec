"""The model interface: ``pooled [B, pooled_dim]`` in, logits ``[B, T]`` out, for every built-in with per-field
dims and a shared table; the per-table lookup; the multi-task loss (masked labels give exactly zero gradient,
a task's weight scales its gradient); and the default DLRM unchanged (state_dict keys, shapes, values, outputs)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from streamrec.foundation import EventBatch
from streamrec.foundation.events import JaggedIds
from streamrec.model import DLRM, build_model, embed_batch, task_logits, unique_ids
from streamrec.trainer.step import train_step
from tests.conftest import small_config

ARCHS = ("dlrm", "dcn_v2", "deepfm", "mlp")
B = 64


def _cfg(tmp_path, arch: str, tasks=("click", "conversion"), weights=None):
    """Fields ``user`` (dim 8), ``last_user`` (sharing ``user``'s table), ``item`` (dim 4), ``tags`` (dim 16)."""
    weights = weights or [1.0] * len(tasks)
    return small_config(tmp_path, **{
        "model.architecture": arch, "model.cross_layers": 2,
        "model.fields": [{"name": "user"}, {"name": "last_user", "table": "user"}, {"name": "item", "dim": 4},
                         {"name": "tags", "dim": 16}],
        "model.tasks": [{"name": t, "weight": w} for t, w in zip(tasks, weights)]})


def _batch(cfg, n: int = B, seed: int = 0) -> EventBatch:
    """Ids from small vocabularies (so the shared table's ids overlap across its fields); task 0's label is
    learnable from ``user``'s parity, task 1's from ``item``'s, missing (NaN) on every other event."""
    rng = np.random.default_rng(seed)
    sparse = {}
    for f in cfg.model.field_names:
        k = 2 if f == "tags" else 1
        sparse[f] = JaggedIds(rng.integers(0, 20, n * k).astype(np.int64), np.arange(0, n * k + 1, k, dtype=np.int64))
    labels = (sparse["user"].values % 2).astype(np.float32)
    t = np.stack([labels, (sparse["item"].values % 2).astype(np.float32)], axis=1)[:, :len(cfg.model.tasks)]
    if t.shape[1] > 1:
        t[1::2, 1] = np.nan
    batch = EventBatch(np.zeros(n, np.int64), labels, rng.normal(size=(n, cfg.model.dense_dim)).astype(np.float32),
                       sparse)
    batch.task_labels = t.copy()
    return batch


class Tables:
    """In-memory tables (``{table: [20, dim] tensor}``), plain SGD on the rows; counts lookups per table."""

    def __init__(self, cfg, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rows = {t: torch.randn(20, d, generator=g) * 0.1 for t, d in cfg.model.tables.items()}
        self.lookups: dict[str, int] = {}
        self.grads: dict[str, tuple[np.ndarray, torch.Tensor]] = {}

    def lookup(self, table, ids):
        self.lookups[table] = self.lookups.get(table, 0) + 1
        return self.rows[table][torch.from_numpy(ids)]

    def apply(self, table, ids, grads):
        self.grads[table] = (ids.copy(), grads.detach().clone())
        self.rows[table][torch.from_numpy(ids)] -= 0.1 * grads


def _losses(cfg, model, tables, batch):
    with torch.no_grad():
        pooled, _ = embed_batch(batch, cfg.model, tables.lookup, torch.device("cpu"))
        logits = task_logits(model(torch.from_numpy(batch.dense), pooled), len(cfg.model.tasks))
        y = torch.from_numpy(batch.task_labels)
        have = ~torch.isnan(y)
        return [float(torch.nn.functional.binary_cross_entropy_with_logits(logits[have[:, t], t], y[have[:, t], t]))
                for t in range(y.shape[1])]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_built_in_takes_flat_pooled_per_field_dims_and_a_shared_table_and_trains(tmp_path, arch):
    cfg = _cfg(tmp_path, arch)
    assert cfg.model.pooled_dim == 8 + 8 + 4 + 16 and list(cfg.model.tables) == ["user", "item", "tags"]
    model = build_model(cfg.model)
    out = model(torch.randn(5, cfg.model.dense_dim), torch.randn(5, cfg.model.pooled_dim))
    assert out.shape == (5, 2) and bool(torch.isfinite(out).all())
    tables, batch = Tables(cfg), _batch(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = _losses(cfg, model, tables, batch)
    for _ in range(60):
        tables.lookups.clear()
        scores = train_step(model, opt, batch, cfg.model, tables.lookup, tables.apply, torch.device("cpu"))
        assert scores.shape == (B, 2) and tables.lookups == {"user": 1, "item": 1, "tags": 1}  # once per TABLE
    after = _losses(cfg, model, tables, batch)
    assert after[0] < before[0] - 0.05 and after[1] < before[1] - 0.05, (before, after)


def test_a_shared_table_is_one_unique_set_and_its_gradient_sums_both_fields(tmp_path):
    cfg = _cfg(tmp_path, "mlp")
    batch = _batch(cfg)
    uniq = unique_ids(batch, cfg.model)
    assert list(uniq) == ["user", "item", "tags"]
    both = np.concatenate([batch.sparse["user"].values, batch.sparse["last_user"].values])
    np.testing.assert_array_equal(uniq["user"][0], np.unique(both))
    rows = torch.randn(20, 8)
    pooled, touched = embed_batch(batch, cfg.model, lambda t, ids: rows[torch.from_numpy(ids)] if t == "user"
                                  else torch.ones(len(ids), cfg.model.tables[t]), torch.device("cpu"),
                                  requires_grad=True, uniques=uniq)
    assert pooled.shape == (B, cfg.model.pooled_dim) and [t for t, _, _ in touched] == ["user", "item", "tags"]
    # columns: user [0, 8), last_user [8, 16) pool from the same rows
    torch.testing.assert_close(pooled[:, 0:8], rows[torch.from_numpy(batch.sparse["user"].values)], rtol=0, atol=0)
    torch.testing.assert_close(pooled[:, 8:16], rows[torch.from_numpy(batch.sparse["last_user"].values)], rtol=0,
                               atol=0)
    (pooled[:, 0:8].sum() + 2 * pooled[:, 8:16].sum()).backward()
    ids, leaf = touched[0][1], touched[0][2]
    want = torch.tensor([float((batch.sparse["user"].values == i).sum() + 2 * (batch.sparse["last_user"].values == i).sum())
                         for i in ids])
    torch.testing.assert_close(leaf.grad, want[:, None].expand(-1, 8), rtol=0, atol=0)


def _grads(cfg, batch, weights=None, seed: int = 0):
    """Every dense parameter's gradient and every table's row gradients of one ``train_step`` (lr 0: nothing moves)."""
    model = build_model(cfg.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tables = Tables(cfg, seed)
    train_step(model, opt, batch, cfg.model, tables.lookup, tables.apply, torch.device("cpu"), weights=weights)
    dense = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return dense, tables.grads


@pytest.mark.parametrize("arch", ARCHS)
def test_a_masked_label_contributes_exactly_zero_gradient(tmp_path, arch):
    """Task 1 is missing on every second event. With task 0 weighted 0, task 1 missing everywhere leaves every
    gradient (dense and rows) exactly zero; a missing label is not a 0 label (filling in 0 changes the
    gradient); and the missing events add nothing to task 1's gradient: it equals the gradient of its labelled
    events alone (below)."""
    cfg = _cfg(tmp_path, arch)
    batch = _batch(cfg)
    d1, r1 = _grads(cfg, batch)
    assert all(bool(torch.isfinite(g).all()) for g in d1) and all(bool(torch.isfinite(g).all()) for _, g in r1.values())
    # a label of 0 where it was missing is NOT masking: the gradient changes (the check above can fail)
    zeroed = _batch(cfg)
    zeroed.task_labels[1::2, 1] = 0.0
    d3, _ = _grads(cfg, zeroed)
    assert any(not torch.equal(a, b) for a, b in zip(d1, d3))
    # only masked terms left: no gradient at all
    none = _batch(cfg)
    none.task_labels[:, 1] = np.nan
    d4, r4 = _grads(cfg, none, weights=[0.0, 1.0])
    assert all(bool((g == 0).all()) for g in d4) and all(bool((g == 0).all()) for _, g in r4.values())


def test_a_task_labelled_on_part_of_the_batch_pulls_by_that_part(tmp_path):
    """Task 1's gradient (task 0 weighted 0) is the gradient of the batch of its labelled events alone, scaled by
    the labelled share of the batch: its masked sum is divided by the batch size."""
    cfg = _cfg(tmp_path, "dlrm")
    batch = _batch(cfg)
    d_all, _ = _grads(cfg, batch, weights=[0.0, 1.0])
    labelled = batch.take(np.arange(0, B, 2))
    labelled.task_labels = batch.task_labels[0::2].copy()
    d_sub, _ = _grads(cfg, labelled, weights=[0.0, 1.0])
    share = len(labelled) / B
    assert all(torch.allclose(a, share * b, atol=1e-7, rtol=1e-5) for a, b in zip(d_all, d_sub))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_tasks_weight_scales_its_gradient(tmp_path, arch):
    cfg = _cfg(tmp_path, arch)
    batch = _batch(cfg)
    base, rb = _grads(cfg, batch, weights=[1.0, 0.0])
    one, r1 = _grads(cfg, batch, weights=[1.0, 1.0])
    three, r3 = _grads(cfg, batch, weights=[1.0, 3.0])
    for b, o, t in zip(base, one, three):
        torch.testing.assert_close(t - b, 3 * (o - b), atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(o, b) for b, o in zip(base, one))  # task 1 has a gradient to scale
    for tb in rb:
        torch.testing.assert_close(r3[tb][1] - rb[tb][1], 3 * (r1[tb][1] - rb[tb][1]), atol=1e-6, rtol=1e-4)


def test_task_logits_accepts_b_for_one_task_and_refuses_other_shapes():
    assert task_logits(torch.zeros(4), 1).shape == (4, 1)
    assert task_logits(torch.zeros(4, 3), 3).shape == (4, 3)
    for out, t in ((torch.zeros(4, 2), 1), (torch.zeros(4), 2), (torch.zeros(4, 1, 1), 1)):
        with pytest.raises(ValueError) as e:
            task_logits(out, t)
        assert "\n" not in str(e.value) and "expected" in str(e.value)


@pytest.mark.parametrize("arch", ("dlrm", "deepfm"))
def test_projections_exist_only_for_fields_off_the_embedding_dim(tmp_path, arch):
    cfg = _cfg(tmp_path, arch)
    keys = [k for k in build_model(cfg.model).state_dict() if k.startswith("project.")]
    assert keys == ["project.2.weight", "project.3.weight"]  # item (dim 4) and tags (dim 16); no bias
    default = small_config(tmp_path, **{"model.architecture": arch})
    assert not any(k.startswith("project.") for k in build_model(default.model).state_dict())


# the default DLRM's initial state_dict (seed 7) and its logits on a fixed probe, as the model computed them before
# the flat-pooled, [B, T] interface: a checkpoint or snapshot of it loads and scores exactly as it did
PINNED_STATE_SHA256 = "c65135d9ee9ef3f7e6cfc729aef3a7b17d5cca955a67e91d952251adcc69c091"
PINNED_LOGITS = [-0.1409793, -0.2246626, -0.1003171, -0.1354344, -0.0720155]


def test_the_default_dlrm_is_unchanged():
    m = DLRM(3, 4, 8, [16, 8], [16], seed=7)
    sd = m.state_dict()
    assert [(k, tuple(v.shape)) for k, v in sd.items()] == [
        ("bottom.0.weight", (16, 4)), ("bottom.0.bias", (16,)), ("bottom.2.weight", (8, 16)), ("bottom.2.bias", (8,)),
        ("top.0.weight", (16, 14)), ("top.0.bias", (16,)), ("top.2.weight", (1, 16)), ("top.2.bias", (1,))]
    h = hashlib.sha256()
    for k, v in sd.items():
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    assert h.hexdigest() == PINNED_STATE_SHA256
    g = torch.Generator().manual_seed(1)
    dense, pooled = torch.randn(5, 4, generator=g), torch.randn(5, 3, 8, generator=g)
    with torch.no_grad():
        out = m(dense, pooled.flatten(1))
        # the computation as it was, over [B, fields, dim]: the same values to the last bit
        x = m.bottom(dense)
        z = torch.cat([x.unsqueeze(1), pooled], dim=1)
        tri = torch.tril_indices(4, 4, offset=-1)
        old = m.top(torch.cat([x, torch.bmm(z, z.transpose(1, 2))[:, tri[0], tri[1]]], dim=1)).squeeze(1)
    assert out.shape == (5, 1) and torch.equal(out[:, 0], old)
    np.testing.assert_allclose(out[:, 0].numpy(), PINNED_LOGITS, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_adding_a_task_keeps_the_first_tasks_starting_point(tmp_path, arch):
    """A model of two tasks starts with the one-task model's weights, its extra task's head rows aside: the
    first task's initial scores are the one-task model's, so adding a task is judged by training alone."""
    from streamrec.foundation.model_config import TaskSpec
    from streamrec.model import build_model

    one = _cfg(tmp_path, arch)
    one.model.tasks = [TaskSpec("click")]
    two = _cfg(tmp_path, arch)
    two.model.tasks = [TaskSpec("click"), TaskSpec("conversion")]
    m1, m2 = build_model(one.model), build_model(two.model)
    dense, pooled = torch.randn(5, one.model.dense_dim), torch.randn(5, one.model.pooled_dim)
    with torch.no_grad():
        torch.testing.assert_close(m2(dense, pooled)[:, 0], task_logits(m1(dense, pooled), 1)[:, 0], rtol=0, atol=1e-6)
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    differ = [k for k in s1 if s1[k].shape != s2[k].shape]
    assert differ and all(torch.equal(s2[k][:1], s1[k]) for k in differ), differ
    assert all(torch.equal(s1[k], s2[k]) for k in s1 if k not in differ)
