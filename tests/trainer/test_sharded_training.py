"""A trainer group with row-wise sharded embeddings trains the model one trainer would (real gloo
collectives between spawned processes on loopback, real RocksDB shards)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.trainer import TrainerCore
from streamrec.trainer.sharding import owner_of

from ..conftest import small_config
from ..helpers.group import rank1_config_errors, run_group_scenarios, split, synthetic

N_EVENTS, BATCH = 6144, 256
# the tests that read the shared group's results (``group_runs``) run on one xdist worker, so the group is spawned once
GROUP_RUNS_WORKER = pytest.mark.xdist_group("sharded-group-runs")


ARCHS = ("dlrm", "dcn_v2", "deepfm", "mlp")


def _cfg(tmp):
    cfg = small_config(tmp)
    cfg.trainer.batch_size, cfg.trainer.device = BATCH, "cpu"
    return cfg


def _setup(cfg, arch: str = "dlrm", tasks: bool = False, tables: bool = False, fake: bool = False,
           admit: bool = False):
    """``cfg`` for architecture ``arch``; ``tasks``: two tasks, ``click`` and a ``conversion`` of weight 0.5;
    ``tables``: fields of their own widths (user 8, item 24) and two fields sharing one table (tags looks its
    ids up in category's); ``fake``: a fake-negative stream (the weighted loss, trainer/step.py); ``admit``:
    ids admitted from their third training step on (store.admit_min_count), the others read zeros (a group
    admits in zero mode)."""
    from streamrec.foundation.model_config import TaskSpec

    if admit:
        cfg.store.admit_min_count, cfg.store.unadmitted = 3, "zero"

    cfg.model.architecture, cfg.model.cross_layers = arch, 2
    if fake:
        cfg.join.mode = "fake_negative"
    if tasks:
        cfg.model.tasks = [TaskSpec("click"), TaskSpec("conversion", 0.5)]
    if tables:
        for f in cfg.model.fields:
            f.dim = {"user": 8, "item": 24}.get(f.name, 0)
            f.table = "category" if f.name == "tags" else ""
    return cfg


def _events(cfg, n: int = N_EVENTS):
    """The synthetic stream; with two tasks, ``conversion`` labelled on one event in ten (a click that converts
    with probability one half), missing on the rest."""
    batch = synthetic(cfg, n)
    if len(cfg.model.tasks) > 1:
        rng = np.random.default_rng(5)
        conv = np.where(rng.random(n) < 0.5, batch.labels, 0.0).astype(np.float32)
        conv[rng.random(n) >= 0.1] = np.nan
        batch.task_labels = np.stack([batch.labels, conv], axis=1).astype(np.float32)
    if cfg.join.mode == "fake_negative":  # every event a fake negative or a positive (no request ids: scored as they come)
        from streamrec.foundation import FEEDBACK_CODES

        batch.feedback = np.where(batch.labels == 1, FEEDBACK_CODES["positive"],
                                  FEEDBACK_CODES["fake_negative"]).astype(np.int8)
    return batch


def _train_rank(rank, world, cfg, tmp, arch: str = "dlrm", tasks: bool = False, tables: bool = False,
                fake: bool = False, admit: bool = False):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    cfg = _setup(cfg, arch, tasks, tables, fake, admit)
    torch.manual_seed(0)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=cfg.store, join=cfg.join)
    batch = split(_events(cfg), rank, world)
    core.train_window(batch)
    # the rank's own rows: every id it was asked for that it owns
    owned = {}
    for f, tb in cfg.model.field_tables.items():
        ids = np.unique(synthetic(cfg, N_EVENTS).sparse[f].values)
        mine = ids[owner_of(tb, ids, world) == rank]
        owned[f] = (mine, store.peek(tb, mine).numpy(), store.peek_held(tb, mine)[1])
    g = core.group_metrics()
    metrics_bytes = core.metrics_bytes_sent  # one record's figures on the wire from this rank
    tasks_figures = core.group_task_figures()  # a collective: every rank calls it
    out = {"tasks": tasks_figures, "metrics_bytes": metrics_bytes, "auc": g.auc, "logloss": g.logloss, "window_auc": g.window_auc(), "events": core.events, "steps": core.steps, "owned": owned,
           "binned": float(g.pos.sum() + g.neg.sum()),
           "dense": {k: v.detach().numpy().copy() for k, v in core.model.state_dict().items()}}
    store.close()
    return out


def _single(tmp, arch: str = "dlrm", tasks: bool = False, tables: bool = False, fake: bool = False,
            admit: bool = False):
    cfg = _setup(_cfg(tmp), arch, tasks, tables, fake, admit)
    torch.manual_seed(0)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / "single"))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    core.train_window(_events(cfg))
    return core, store


@pytest.mark.subprocess
@GROUP_RUNS_WORKER
@pytest.mark.parametrize("scenario", ["train", *(f"train_{a}" for a in ARCHS[1:]), "train_two_tasks",
                                      "train_tables", "train_fake_negative", "train_admission"])
def test_two_ranks_train_the_model_one_trainer_would(tmp_path, group_runs, scenario):
    """For every built-in architecture, for two tasks (one labelled on a tenth of the events: each task's
    loss is the group's masked sum over the group's batch, not each rank's), for fields of their own widths
    with a shared table and for a fake-negative stream (each event weighed by its detached probability): the
    same dense weights, rows and AUC as one trainer. With admission by frequency: the same ids admitted
    (counted by each id's owner, which sees every step that holds it)."""
    arch = scenario.removeprefix("train_") if scenario in (f"train_{a}" for a in ARCHS) else "dlrm"
    core, store = _single(tmp_path, arch, tasks=scenario == "train_two_tasks", tables=scenario == "train_tables",
                          fake=scenario == "train_fake_negative", admit=scenario == "train_admission")
    assert core.fake_negative == (scenario == "train_fake_negative")
    tables = _setup(_cfg(tmp_path), tables=scenario == "train_tables").model.field_tables
    ranks = group_runs[scenario]
    for r in ranks:
        assert abs(r["auc"] - core.metrics.auc) <= 0.001, (r["auc"], core.metrics.auc)
        assert abs(r["logloss"] - core.metrics.logloss) <= 1e-3
        assert abs(r["window_auc"] - core.metrics.window_auc()) <= 0.001  # the group's window, not one rank's
        assert r["steps"] == N_EVENTS // BATCH
        assert r["binned"] == N_EVENTS  # the since-start AUC counts every event once (not the window twice)
        # the record's traffic is counted: a ring all-reduce of both histograms and two totals (float64) and
        # the all-gather of every rank's share of the window, (label, score) float32 pairs and a count
        bins, share = core.metrics.bins, core.metrics.window // 2
        assert r["metrics_bytes"] == 2 * (2 - 1) * (2 * bins + 2) * 8 // 2 + (2 - 1) * 2 * (share + 1) * 4
        for name, f in core.task_figures().items():  # every task's group figures are one trainer's
            assert r["tasks"][name]["labelled"] == f["labelled"], (name, r["tasks"][name], f)
            assert abs(r["tasks"][name]["auc"] - f["auc"]) <= 0.001, (name, r["tasks"][name], f)
        for k, v in core.model.state_dict().items():
            np.testing.assert_allclose(r["dense"][k], v.numpy(), atol=1e-4, err_msg=k)
    assert sum(r["events"] for r in ranks) == N_EVENTS
    for f, tb in tables.items():  # every row, at its owner, as the single trainer has it
        for r in ranks:
            ids, rows, held = r["owned"][f]
            np.testing.assert_allclose(rows, store.peek(tb, ids).numpy(), atol=1e-4)
            np.testing.assert_array_equal(held, store.peek_held(tb, ids)[1])  # the same admission decisions
        if scenario == "train_admission":
            held_any = np.concatenate([r["owned"][f][2] for r in ranks])
            assert 0 < held_any.mean() < 1  # some ids admitted, some not: the comparison can fail
    store.close()


@pytest.mark.subprocess
@GROUP_RUNS_WORKER
def test_an_idle_rank_joins_every_step_with_an_empty_batch(group_runs):
    ranks = group_runs["idle"]
    assert ranks[0]["events"] == N_EVENTS // 2 and ranks[1]["events"] == 0
    assert ranks[0]["steps"] == ranks[1]["steps"] == N_EVENTS // 2 // (BATCH // 2)
    # the group's AUC is known on the idle rank too: a number, the same one the busy rank reports
    assert np.isfinite(ranks[1]["auc"]) and ranks[1]["auc"] == ranks[0]["auc"], (ranks[0]["auc"], ranks[1]["auc"])


def _idle_rank(rank, world, cfg, tmp):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=cfg.store, join=cfg.join)
    core.train_window(synthetic(cfg, N_EVENTS // 2) if rank == 0 else None)
    out = {"events": core.events, "steps": core.steps, "auc": core.group_metrics().auc}
    store.close()
    return out


@pytest.mark.subprocess
@GROUP_RUNS_WORKER
def test_a_poisoned_event_is_refused_by_the_whole_group(group_runs):
    ranks = group_runs["poisoned"]
    assert ranks[1]["rejected"] == [5] and ranks[0]["rejected"] == []
    assert ranks[0]["finite"] and ranks[1]["finite"]
    assert ranks[0]["events"] + ranks[1]["events"] == 2 * 512 - 1


def _poisoned_rank(rank, world, cfg, tmp):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=cfg.store, join=cfg.join)
    b = synthetic(cfg, 512)
    if rank == 1:
        b.dense[5, 0] = 3e38  # contract-valid only if the bound is off; here straight into the core
    res = core.train_window(b)
    finite = all(bool(torch.isfinite(p).all()) for p in core.model.parameters())
    out = {"rejected": res.rejected.tolist(), "finite": finite, "events": core.events}
    store.close()
    return out


def test_owners_are_stable_and_spread():
    ids = np.arange(100_000, dtype=np.int64)
    own = owner_of("item", ids, 3)
    assert set(np.unique(own)) == {0, 1, 2}
    assert np.all(np.abs(np.bincount(own) / len(ids) - 1 / 3) < 0.01)
    np.testing.assert_array_equal(own, owner_of("item", ids, 3))  # a pure function of (table, id, world)
    assert not np.array_equal(own, owner_of("user", ids, 3))  # tables spread independently
    assert np.all(owner_of("item", ids, 1) == 0)


def _out_of_step_rank(rank, world, cfg, tmp):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=cfg.store, join=cfg.join)
    core.train_window(None)
    if rank == 1:
        core.windows += 1  # as if this rank had trained a window the other did not
    try:
        core.train_window(None)
        return "no error"
    except RuntimeError as e:
        return str(e)
    finally:
        store.close()


@pytest.mark.subprocess
@GROUP_RUNS_WORKER
def test_ranks_out_of_step_get_a_clear_error(group_runs):
    ranks = group_runs["out_of_step"]
    assert all("every rank must call train_window once per window" in r for r in ranks), ranks


@pytest.mark.subprocess
@GROUP_RUNS_WORKER
def test_ranks_with_different_group_settings_get_a_clear_error_naming_them(group_runs):
    """Settings every rank must share (the wire formats, the dense sum's compression, what batch_size counts):
    a rank with another value stops the group at once with the values named, not a gloo size mismatch."""
    ranks = group_runs["config_errors"]
    for r in ranks:
        assert all("every rank of a group must use the same config" in e for e in r), r
    wire, powersgd, batch = zip(*ranks)
    assert "trainer.exchange_precision='fp32'" in wire[0] and "trainer.exchange_precision='bf16'" in wire[1]
    assert all("dense_allreduce_compression" in e for e in powersgd)
    assert "trainer.group_batch='group'" in batch[0] and "trainer.group_batch='rank'" in batch[1]


# rank 1 with another value of a setting every rank must share (test_ranks_with_different_group_settings_...)
SHARED_SETTING_CASES = [("exchange_precision", "bf16"), ("dense_allreduce_compression", "powersgd"),
                        ("group_batch", "rank")]


@pytest.fixture(scope="module")
def group_runs(tmp_path_factory):
    """Every group scenario of this file in one spawned group of two ranks, in turn (each with a config and a
    directory of its own): one spawn and rendezvous instead of one per test. The scenarios that end in an error
    on every rank come last."""
    return run_group_scenarios(2, _cfg, tmp_path_factory.mktemp("sharded-group"), {
        "train": _train_rank,
        **{f"train_{a}": functools.partial(_train_rank, arch=a) for a in ARCHS[1:]},
        "train_two_tasks": functools.partial(_train_rank, tasks=True),
        "train_tables": functools.partial(_train_rank, tables=True),
        "train_fake_negative": functools.partial(_train_rank, fake=True),
        "train_admission": functools.partial(_train_rank, admit=True),
        "idle": _idle_rank,
        "poisoned": _poisoned_rank,
        "out_of_step": _out_of_step_rank,
        "config_errors": rank1_config_errors(*SHARED_SETTING_CASES),
    })


def test_a_group_refuses_the_shared_unadmitted_row_before_any_collective(tmp_path):
    """One shared row per rank would split the model: a group admits ids in zero mode, and says so in one line."""
    from streamrec.foundation import ConfigError
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    cfg = _cfg(tmp_path)
    cfg.store.admit_min_count, cfg.store.unadmitted = 2, "shared"
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                         torch.device("cpu"), path=str(tmp_path / "s"))
    try:
        with pytest.raises(ConfigError, match='store.unadmitted = "zero"'):
            ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), 0, 2,
                               store_cfg=cfg.store, join=cfg.join)  # no process group: nothing else ran
    finally:
        store.close()
