"""``trainer.group_batch = "rank"``: each rank of a group trains ``batch_size`` events per step (real gloo
collectives between spawned processes on loopback, real RocksDB shards), so a group step is
``world x batch_size`` events; the checkpoint manifest records the mode, and a restart that would switch
it silently is refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.foundation.config import ConfigError
from streamrec.app.config import load_config
from streamrec.trainer import TrainerCore
from streamrec.trainer.group import GroupError, batch_mode, check_batch_mode
from streamrec.trainer.batch_sizes import batch_sizes

from ..conftest import small_config
from ..helpers.group import run_group, split, synthetic

N_EVENTS, BATCH = 6144, 256


def _cfg(tmp):
    cfg = small_config(tmp)
    cfg.trainer.batch_size, cfg.trainer.device, cfg.trainer.group_batch = BATCH, "cpu", "rank"
    return cfg


def _rank_mode_rank(rank, world, cfg, tmp):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    torch.manual_seed(rank)  # different seeds: the broadcast at start must make the ranks' weights one
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=cfg.store, join=cfg.join)
    step_sizes = []  # every rank's events in each step, as the counts message told this rank
    fetch = core.exchange.fetch

    def counting_fetch(uniques, batch_size, *occurrences):
        rows, sizes = fetch(uniques, batch_size, *occurrences)
        step_sizes.append(sizes.tolist())
        return rows, sizes

    core.exchange.fetch = counting_fetch
    core.train_window(split(synthetic(cfg, N_EVENTS), rank, world))
    g = core.group_metrics()
    out = {"sizes": step_sizes, "steps": core.steps, "events": core.events, "auc": g.auc, "logloss": g.logloss,
           "local_batch": core.local_batch,
           "dense": {k: v.detach().numpy().copy() for k, v in core.model.state_dict().items()}}
    store.close()
    return out


@pytest.mark.subprocess
def test_rank_mode_steps_hold_batch_size_per_rank_and_train_one_trainer_at_n_times_the_batch(tmp_path):
    ranks = run_group(2, _cfg, tmp_path, _rank_mode_rank)
    per_rank = N_EVENTS // 2
    for r in ranks:
        assert r["local_batch"] == BATCH
        assert r["steps"] == per_rank // BATCH  # 12 steps of 256 per rank, not 24 of 128 (the "group" mode)
        assert r["sizes"] == [[BATCH, BATCH]] * (per_rank // BATCH)  # every step: batch_size events on each rank
    assert sum(r["events"] for r in ranks) == N_EVENTS
    for k, v in ranks[0]["dense"].items():  # one optimizer step on one summed gradient: the same weights
        np.testing.assert_array_equal(ranks[1]["dense"][k], v, err_msg=k)
    # events i % 2 == r on rank r: group step k holds the stream's events [512k, 512k + 512), one trainer's
    # step k at batch 2 x 256: the same model (the global batch is world x batch_size)
    cfg = small_config(tmp_path)
    cfg.trainer.batch_size, cfg.trainer.device = 2 * BATCH, "cpu"
    torch.manual_seed(0)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp_path / "single"))
    # seed 0: the group's start is rank 0's (seed 0) weights
    single = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    single.train_window(synthetic(cfg, N_EVENTS))
    assert abs(ranks[0]["auc"] - single.metrics.auc) <= 0.001, (ranks[0]["auc"], single.metrics.auc)
    assert abs(ranks[0]["logloss"] - single.metrics.logloss) <= 1e-3
    for k, v in single.model.state_dict().items():
        np.testing.assert_allclose(ranks[0]["dense"][k], v.numpy(), atol=1e-4, err_msg=k)
    store.close()


def test_local_batch_and_the_manifest_fields(tmp_path):
    cfg = small_config(tmp_path)
    cfg.trainer.batch_size = 512
    assert cfg.trainer.group_batch == "group"  # the default: exact, the group's batch
    assert batch_sizes(cfg.trainer, 4).step == 128 and batch_mode(cfg.trainer, 4) == {
        "group_batch": "group", "rank_batch": 128, "global_batch": 512}
    cfg.trainer.group_batch = "rank"
    assert batch_sizes(cfg.trainer, 4).step == 512 and batch_mode(cfg.trainer, 4) == {
        "group_batch": "rank", "rank_batch": 512, "global_batch": 2048}


def test_an_unknown_group_batch_is_refused_with_the_key_named():
    with pytest.raises(ConfigError, match="group_batch"):
        load_config(None, {"trainer.group_batch": "event"})
    assert load_config(None, {"trainer.group_batch": "rank"}).trainer.group_batch == "rank"


def test_a_restart_in_the_other_mode_is_refused_clearly(tmp_path, caplog):
    cfg = small_config(tmp_path)
    cfg.trainer.batch_size = 512
    written = {"world": 2, **batch_mode(cfg.trainer, 2)}  # a "group" manifest: global batch 512
    cfg.trainer.group_batch = "rank"  # would train 2 x 512 per step
    with pytest.raises(GroupError) as e:
        check_batch_mode(written, cfg.trainer, 2, "ckpt-000000007")
    msg = str(e.value)
    assert "ckpt-000000007" in msg and "trainer.group_batch='group'" in msg and "trainer.group_batch='rank'" in msg
    assert "global batch 512" in msg and "global batch 1024" in msg
    with pytest.raises(GroupError):  # a manifest from before the key: it was a "group" group
        check_batch_mode({"world": 2}, cfg.trainer, 2)
    check_batch_mode({"world": 2, **batch_mode(cfg.trainer, 2)}, cfg.trainer, 2)  # the same mode: resumes
    check_batch_mode({"offsets": []}, cfg.trainer, 2)  # a plain trainer's checkpoint: either mode
    cfg.trainer.batch_size = 256  # "group" at 512 on 2 ranks == "rank" at 256: the same steps, allowed
    check_batch_mode(written, cfg.trainer, 2)
    with caplog.at_level(logging.WARNING, logger="streamrec.trainer.group"):  # a reshard in "rank" mode
        check_batch_mode({"world": 2, **batch_mode(cfg.trainer, 2)}, cfg.trainer, 4, "ckpt-000000009")
    assert any("global batch of 512" in r.getMessage() and "trains 1024" in r.getMessage() for r in caplog.records)
