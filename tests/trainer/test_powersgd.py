"""A trainer group's dense all-reduce compressed with PowerSGD (``trainer.dense_allreduce_compression
= "powersgd"``, :mod:`streamrec.trainer.dense_sync`): the bytes on the wire are exactly the formula's,
every rank takes the identical step, the model stays within a stated tolerance of the exact fp32
group's, a refused step leaves the compressor as it was, and a restarted group that gets its
checkpoint's state back continues the same trajectory. Real gloo collectives between spawned
processes on 127.0.0.1, real RocksDB shards."""

from __future__ import annotations

import copy
import dataclasses
import io

import numpy as np
import pytest
import torch

from streamrec.app.wiring import trainer_settings
from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.foundation.config import ConfigError
from streamrec.app.config import load_config

from ..conftest import small_config
from ..helpers.group import run_group_scenarios, split, synthetic
from .test_compressed_exchange import _rel_diff

N_EVENTS, BATCH = 6144, 256
# (name, dense_allreduce_precision, powersgd_rank, powersgd_start_iter); "exact" is the uncompressed fp32 group
SETUPS = (("exact", "fp32", 4, 0), ("psgd4", "fp32", 4, 3), ("bf16-psgd1", "bf16", 1, 0), ("fp16-psgd4", "fp16", 4, 0))
# stated tolerances against the exact fp32 group on the same 6,144 events (24 steps): |dAUC|, |dlogloss|, and the
# relative L2 distance of all dense weights. Measured (2026-11-25): psgd4 dAUC -0.00013..-0.00016, dlogloss 3e-5,
# dense 0.032; fp16-psgd4 -0.00035, 2e-5, 0.045; bf16-psgd1 -0.0029, +0.0036, 0.114 (rank 1 from the first step)
AUC_TOL, LOGLOSS_TOL, DENSE_TOL = 0.006, 0.006, 0.2


# the tests that read the shared group's results (``group_runs``) run on one xdist worker, so the group is spawned once
GROUP_RUNS_WORKER = pytest.mark.xdist_group("powersgd-group-runs")


def _cfg(tmp):
    """The small model with a top layer wide enough for low rank to pay: its 64x14 and 16x64 weights
    are compressed at rank 4 (torch's rule: (n + m) r * 2 < n m), every other tensor is not."""
    cfg = small_config(tmp, **{"model.top_mlp": [64, 16]})
    cfg.trainer.batch_size, cfg.trainer.device = BATCH, "cpu"
    return cfg


def _compressed(cfg, shapes, rank_k):
    """(uncompressed elements, P elements, Q elements) by the rule, from the parameter shapes alone."""
    plain = p = q = 0
    for s in shapes:
        n = int(np.prod(s))
        rows, cols = (s[0], n // s[0]) if len(s) > 1 else (0, 0)
        r = min(rows, cols, rank_k)
        if r and (rows + cols) * r * 2 < rows * cols:
            p, q = p + rows * r, q + cols * r
        else:
            plain += n
    return plain, p, q


def _train_setups(rank, world, cfg, tmp):
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    batch = split(synthetic(cfg, N_EVENTS), rank, world)
    out = {}
    for name, precision, k, start in SETUPS:
        c = copy.deepcopy(cfg)
        c.trainer.dense_allreduce_precision = precision
        c.trainer.dense_allreduce_compression = "none" if name == "exact" else "powersgd"
        c.trainer.powersgd_rank, c.trainer.powersgd_start_iter = k, start
        torch.manual_seed(0)
        store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model), torch.device("cpu"), path=str(tmp / f"store-{name}-{rank}"))
        core = ShardedTrainerCore(c.model, c.trainer, store, torch.device("cpu"), rank, world,
                                  store_cfg=c.store, join=c.join)
        res = core.train_window(batch)
        g = core.group_metrics()
        out[name] = {"auc": g.auc, "logloss": g.logloss, "steps": core.steps, "rejected": len(res.rejected),
                     "dense_bytes": core.dense_bytes_sent, "iter": core.dense_sync.iter,
                     "retries": core.dense_fp32_retries,
                     "shapes": [tuple(p.shape) for p in core.model.parameters()],
                     "dense": {n: v.detach().numpy().copy() for n, v in core.model.state_dict().items()}}
        store.close()
    return out


@pytest.mark.subprocess
@pytest.mark.timeout(500)  # above the shared group's own wait (group_runs: 400 s for the ranks, then their joins)
@GROUP_RUNS_WORKER
def test_powersgd_sends_the_formula_s_bytes_and_every_rank_takes_the_same_step(tmp_path, group_runs):
    ranks = group_runs["setups"]
    cfg, world = _cfg(tmp_path), 2
    exact = ranks[0]["exact"]
    steps, shapes = exact["steps"], exact["shapes"]
    params = sum(int(np.prod(s)) for s in shapes)
    assert steps == N_EVENTS // BATCH

    def ring(numel, width):  # one rank's bytes for a ring all-reduce of numel elements
        return 2 * (world - 1) * numel * width // world

    for name, precision, k, start in SETUPS:
        wire = 4 if precision == "fp32" else 2
        plain, p, q = _compressed(cfg, shapes, k)
        assert p and q and plain < params / 5, (name, plain, p, q)  # the test model does compress
        warm = steps if name == "exact" else min(start, steps)
        # warm-up steps: everything and the world + 1 flags in one buffer; then the uncompressed rest, the flags
        # and all Ps in one buffer, all Qs in another (fp16: the rest and flags in fp16, then the Ps, then the Qs,
        # P and Q in bf16: 2 B either way)
        two = ring(plain + world + 1 + p, wire) + ring(q, wire)
        three = ring(plain + world + 1, wire) + ring(p, wire) + ring(q, wire)
        want = warm * ring(params + world + 1, wire) + (steps - warm) * (three if precision == "fp16" else two)
        for r in ranks:
            assert r[name]["rejected"] == 0 and r[name]["steps"] == steps and r[name]["iter"] == steps, name
            assert r[name]["retries"] == 0, name  # fp16: the rest's sums did not overflow (no fp32 sums to add)
            assert r[name]["dense_bytes"] == want, (name, r[name]["dense_bytes"], want)
    assert ranks[0]["psgd4"]["dense_bytes"] < 0.5 * ranks[0]["exact"]["dense_bytes"]
    for name, *_ in SETUPS:  # every rank took the identical dense steps
        for key, v in ranks[0][name]["dense"].items():
            np.testing.assert_array_equal(ranks[1][name]["dense"][key], v, err_msg=f"{name} {key}")
    for name, *_ in SETUPS[1:]:
        x = ranks[0][name]
        dense = _rel_diff(x["dense"], exact["dense"])
        print(f"{name}: dAUC {x['auc'] - exact['auc']:+.5f} dlogloss {x['logloss'] - exact['logloss']:+.5f} "
              f"dense {dense:.4f} (relative L2 distance from the exact fp32 group's)")
        assert abs(x["auc"] - exact["auc"]) <= AUC_TOL and abs(x["logloss"] - exact["logloss"]) <= LOGLOSS_TOL, name
        assert 0 < dense <= DENSE_TOL, (name, dense)  # compressed: not the exact model, and near it


def _guard(rank, world, cfg, tmp):
    """DenseSync alone: a step refused by the flags, and one whose sum is not finite, leave the error
    feedback and Q as they were; a clean step changes them. Then a poisoned event through the core."""
    from streamrec.trainer.dense_sync import DenseSync
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    t = copy.deepcopy(cfg.trainer)
    t.dense_allreduce_compression, t.powersgd_rank, t.powersgd_start_iter = "powersgd", 2, 0
    params = [torch.zeros(40, 30), torch.zeros(30)]
    ds = DenseSync(t, params, rank, world)
    gen = torch.Generator().manual_seed(rank)
    flat = lambda: torch.randn(1230, generator=gen) * 1e-3  # noqa: E731
    no_flags = torch.zeros(world + 1)
    out = {}
    g, _ = ds(flat(), no_flags)
    state = lambda: (ds.error.clone(), [q.clone() for q in ds.q], ds.iter)  # noqa: E731
    e0, q0, it0 = state()
    out["first"] = {"iter": it0, "error_norm": float(e0.norm()), "finite": bool(torch.isfinite(g).all())}
    flags = no_flags.clone()
    if rank == 1:
        flags[1 + rank] = 1.0  # this rank's own gradients were bad
    b0 = ds.bytes_sent
    g, f = ds(flat(), flags)
    e1, q1, it1 = state()
    out["flagged"] = {"flags": f.tolist(), "same": bool(torch.equal(e0, e1) and all(torch.equal(a, b) for a, b in
                                                                                      zip(q0, q1))) and it1 == it0,
                      "bytes": ds.bytes_sent - b0}
    huge = flat()
    huge[:1200] = 3e38  # every rank's weight gradient finite (no flag), their sum is not
    g, f = ds(huge, no_flags)
    e2, q2, it2 = state()
    same = bool(torch.equal(e0, e2) and all(torch.equal(a, b) for a, b in zip(q0, q2))) and it2 == it0
    out["overflow"] = {"finite": bool(torch.isfinite(g).all()), "flags": f.tolist(), "same": same}
    g, _ = ds(flat(), no_flags)
    e3, q3, it3 = state()
    out["clean"] = {"iter": it3, "changed": not torch.equal(e0, e3) and not torch.equal(q0[0], q3[0])}
    out["plain_numel"] = len(ds.plain_index)

    # the core: an event whose features overflow is refused by the whole group, compressed from the first step
    # (test_sharded_training's poisoned event, on its model: small_config's top layer, where rank 1 pays)
    c = copy.deepcopy(cfg)
    c.model.top_mlp = small_config(tmp).model.top_mlp
    c.trainer.dense_allreduce_compression, c.trainer.powersgd_start_iter, c.trainer.powersgd_rank = "powersgd", 0, 1
    store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model), torch.device("cpu"), path=str(tmp / f"store-{rank}"))
    core = ShardedTrainerCore(c.model, c.trainer, store, torch.device("cpu"), rank, world,
                              store_cfg=c.store, join=c.join)
    b = synthetic(c, 512)
    if rank == 1:
        b.dense[5, 0] = 3e38
    res = core.train_window(b)
    out["poisoned"] = {"rejected": res.rejected.tolist(), "events": core.events, "iter": core.dense_sync.iter,
                       "compressed": len(core.dense_sync.matrices),
                       "finite": all(bool(torch.isfinite(p).all()) for p in core.model.parameters()),
                       "error_finite": bool(torch.isfinite(core.dense_sync.error).all())}
    store.close()
    return out


@pytest.mark.subprocess
@pytest.mark.timeout(500)  # above the shared group's own wait (group_runs: 400 s for the ranks, then their joins)
@GROUP_RUNS_WORKER
def test_a_refused_step_leaves_the_error_feedback_and_q_as_they_were(group_runs):
    ranks = group_runs["guard"]
    for r in ranks:
        assert r["first"]["iter"] == 1 and r["first"]["finite"] and r["first"]["error_norm"] > 0
        assert r["flagged"]["flags"] == [0.0, 0.0, 1.0] and r["flagged"]["same"]
        # the flags are summed with the 30 bias elements and the 40x2 P, and refuse the step: no Q is sent
        assert r["plain_numel"] == 30 and r["flagged"]["bytes"] == 2 * 1 * (30 + 3 + 80) * 4 // 2
        assert not r["overflow"]["finite"] and r["overflow"]["flags"] == [0.0, 0.0, 0.0] and r["overflow"]["same"]
        assert r["clean"]["iter"] == 2 and r["clean"]["changed"]
    assert ranks[0]["poisoned"]["compressed"] == 3  # 16x3, 8x16, 16x14 at rank 1
    assert ranks[1]["poisoned"]["rejected"] == [5] and ranks[0]["poisoned"]["rejected"] == []
    assert sum(r["poisoned"]["events"] for r in ranks) == 2 * 512 - 1
    assert all(r["poisoned"]["finite"] and r["poisoned"]["error_finite"] for r in ranks)
    assert ranks[0]["poisoned"]["iter"] == ranks[1]["poisoned"]["iter"] >= 2  # both steps applied, after retries


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _resume(rank, world, cfg, tmp):
    """Two windows straight through, against: one window, the checkpoint's state (rank 0's manifest part
    for every rank, this rank's own part), a new core on the same store, the second window. And the same
    with the error feedback dropped (what a restart that reset it would do)."""
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    cfg.trainer.dense_allreduce_compression, cfg.trainer.powersgd_start_iter = "powersgd", 2
    whole = split(synthetic(cfg, N_EVENTS), rank, world)
    half = len(whole) // 2
    w1, w2 = whole.take(np.arange(half)), whole.take(np.arange(half, len(whole)))
    out = {}
    for run in ("straight", "resumed", "reset"):
        torch.manual_seed(0)
        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp / f"store-{run}-{rank}"))
        core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                                  store_cfg=cfg.store, join=cfg.join)
        core.train_window(w1)
        if run != "straight":
            box = [core.dense_state() if rank == 0 else None]
            torch.distributed.broadcast_object_list(box, src=0)  # every rank resumes from rank 0's manifest
            state = _roundtrip({**box[0], **core.rank_dense_state()})
            if run == "reset":
                state.pop("dense_sync_rank")
            torch.manual_seed(1)  # another process, other seeds
            core = ShardedTrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), rank, world,
                                      store_cfg=cfg.store, join=cfg.join)
            core.load_dense_state(state)
        core.train_window(w2)
        out[run] = {k: v.detach().numpy().copy() for k, v in core.model.state_dict().items()}
        out[run + "_q"] = [q.numpy().copy() for q in core.dense_sync.q]
        store.close()
    return out


@pytest.mark.subprocess
@pytest.mark.timeout(500)  # above the shared group's own wait (group_runs: 400 s for the ranks, then their joins)
@GROUP_RUNS_WORKER
def test_a_resumed_group_continues_the_same_trajectory(group_runs):
    ranks = group_runs["resume"]
    for r in ranks:
        for k, v in r["straight"].items():
            np.testing.assert_array_equal(r["resumed"][k], v, err_msg=k)
        for a, b in zip(r["straight_q"], r["resumed_q"]):
            np.testing.assert_array_equal(a, b)
        # without its error feedback the group takes other steps (the state the shard keeps matters)
        reset = _rel_diff(r["reset"], r["straight"])
        print(f"rank: error feedback reset at the restart: dense weights {reset:.2e} from the straight run's")
        assert reset > 0
    for a, b in zip(ranks[0]["resumed_q"], ranks[1]["resumed_q"]):  # Q agrees across ranks after the restart
        np.testing.assert_array_equal(a, b)


def test_compression_settings_are_checked_with_the_key_named():
    for key, value in (("dense_allreduce_compression", "topk"), ("powersgd_rank", 0), ("powersgd_rank", 65),
                       ("powersgd_start_iter", -1)):
        with pytest.raises(ConfigError, match=key):
            load_config(None, {f"trainer.{key}": value})
    c = load_config(None, {"trainer.dense_allreduce_compression": "powersgd"})
    assert (c.trainer.dense_allreduce_compression, c.trainer.powersgd_rank) == ("powersgd", 4)
    assert load_config(None, {}).trainer.dense_allreduce_compression == "none"  # exact stays the default


def test_a_rank_gets_its_own_shard_s_error_feedback_back(tmp_path):
    """The group's checkpoint path (trainer/group.py): a rank's shard keeps ``rank_dense_state`` in its
    dense.pt, and ``_open_shard`` hands it back for ``load_dense_state``; a shard without one (written
    before PowerSGD) gives nothing, and the error feedback starts at zero."""
    from streamrec.trainer.checkpoint import write_checkpoint
    from streamrec.trainer.group import GroupTrainerService, rank_sections
    from streamrec.trainer.reshard import rank_dir

    cfg = _cfg(tmp_path)
    root = tmp_path / "ckpt"
    error = torch.arange(7, dtype=torch.float32)
    for seq, dense in ((1, {"dense_sync_rank": {"world": 2, "numel": 7, "error": error}}), (2, {})):
        rank_store, rank_trainer = rank_sections(cfg.store, cfg.trainer, 1, 2)
        c = dataclasses.replace(cfg, store=rank_store, trainer=rank_trainer)
        store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model), torch.device("cpu"))
        write_checkpoint(rank_dir(root, 1), seq, {"rank": 1, "world": 2}, dense,
                         lambda d: {"epoch": int(store.checkpoint(d))})
        store.close()
        svc = object.__new__(GroupTrainerService)  # only what _open_shard reads
        svc.root, svc.rank, svc.world, svc.device = root, 1, 2, torch.device("cpu")
        svc.settings = trainer_settings(c)
        svc._open_shard(root / f"ckpt-{seq:09d}", {"world": 2})
        svc.store.close()
        if seq == 1:
            assert torch.equal(svc._rank_dense["dense_sync_rank"]["error"], error)
        else:
            assert svc._rank_dense == {}


@pytest.fixture(scope="module")
def group_runs(tmp_path_factory):
    """The group scenarios of this file in one spawned group of two ranks, in turn (each with a config and a
    directory of its own): one spawn and rendezvous instead of one per test. The refused steps come last."""
    return run_group_scenarios(2, _cfg, tmp_path_factory.mktemp("powersgd-group"), {
        "setups": _train_setups,
        "resume": _resume,
        "guard": _guard,
    }, timeout=400.0)
