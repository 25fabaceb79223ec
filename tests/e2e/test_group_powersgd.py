"""A trainer group with PowerSGD on its dense all-reduce (`trainer.dense_allreduce_compression =
"powersgd"`), end to end against the real embedded broker: its coordinated checkpoint keeps the
group's Q and step count in rank 0's manifest and each rank's own error feedback in that rank's
shard, and a restarted group continues from them (the count goes on, it does not start again)."""

from __future__ import annotations

import torch

import pytest

from streamrec.trainer.checkpoint import DENSE, latest_checkpoint, read_checkpoint
from streamrec.trainer.reshard import rank_dir
from tests.helpers.trainer import produce, trainer_cfg

from .test_trainer_group import _train

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]
FIRST, SECOND = 3_072, 2_048  # events of the first and the second run


def _state(cfg):
    ckpt = latest_checkpoint(cfg.trainer.checkpoint_dir)
    state, dense = read_checkpoint(ckpt)
    shards = [torch.load(rank_dir(cfg.trainer.checkpoint_dir, r) / ckpt.name / DENSE, weights_only=False)
              for r in range(2)]
    return state, dense["dense_sync"], [s["dense_sync_rank"] for s in shards]


@pytest.mark.timeout(660)  # above its own waits: two group runs of up to 300 s each
def test_a_powersgd_group_checkpoints_its_compressor_and_resumes_it(topics, tmp_path, bootstrap):
    cfg = trainer_cfg(topics, tmp_path)
    t = cfg.trainer
    t.dense_allreduce_compression, t.powersgd_rank, t.powersgd_start_iter = "powersgd", 1, 2
    t.dense_allreduce_precision = "bf16"
    t.idle_exit_s = 2.0
    produce(cfg, bootstrap, FIRST)
    res = _train(cfg, tmp_path / "run1", bootstrap, 2, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    state, group, ranks = _state(cfg)
    params = sum(v.numel() for v in read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))[1]["model"].values())
    assert state["events"] == FIRST and state["world"] == 2
    steps1 = group["iter"]
    assert steps1 >= FIRST // t.batch_size  # every applied step counted (the first two uncompressed)
    assert group["q"] is not None and len(group["q"]) == len(group["layout"]) == 3  # 16x3, 8x16, 16x14 at rank 1
    for r in ranks:  # each rank's own error feedback, over every dense value
        assert r["world"] == 2 and r["error"].numel() == params and bool(torch.isfinite(r["error"]).all())
    assert not torch.equal(ranks[0]["error"], ranks[1]["error"])  # per rank: their events differ

    produce(cfg, bootstrap, SECOND)
    res = _train(cfg, tmp_path / "run2", bootstrap, 2, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    state2, group2, ranks2 = _state(cfg)
    assert state2["events"] == FIRST + SECOND
    # the count went on from the checkpoint's (a group that started again would count from 0)
    assert group2["iter"] >= steps1 + SECOND // t.batch_size
    assert all(r["error"].numel() == params for r in ranks2)
