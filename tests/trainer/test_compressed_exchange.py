"""A trainer group's wire in bf16 / fp16 (``trainer.exchange_precision``,
``trainer.dense_allreduce_precision``): the bytes drop by the factor the formats give, and
the model stays within a stated tolerance of the fp32 group's; ids travel as int32 when
they fit. Real gloo collectives between spawned processes on 127.0.0.1, real RocksDB
shards. (fp32 stays exact: ``test_sharded_training``.)"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.foundation.config import ConfigError
from streamrec.app.config import load_config
from streamrec.trainer.sharding import decode_rows, encode_rows, owner_of, wire_bytes_per_row

from ..conftest import small_config
from ..helpers.group import run_group_scenarios, split, synthetic

N_EVENTS, BATCH = 6144, 256
PRECISIONS = ("fp32", "bf16", "fp16")
# stated tolerances of a compressed wire against the fp32 group on the same 6,144 events: |dAUC|, |dlogloss|,
# and the relative L2 distance of all dense weights / all rows from the fp32 group's at the end. Measured
# (2026-11-25): bf16 dAUC +0.0002, dlogloss 1e-5, dense 0.012, rows 0.047-0.049 (8 mantissa bits: Adagrad's
# first steps, ~lr x sign(g), follow the rounded rows); fp16 dAUC 2e-5, dense 0.0007, rows 0.001-0.003
AUC_TOL, LOGLOSS_TOL = 0.002, 0.002
WEIGHT_TOL = {"bf16": (0.03, 0.10), "fp16": (0.005, 0.01), "fp16-overflow": (0.005, 0.01)}  # (dense, rows)


# the tests that read the shared group's results (``group_runs``) run on one xdist worker, so the group is spawned once
GROUP_RUNS_WORKER = pytest.mark.xdist_group("compressed-group-runs")


def _cfg(tmp):
    cfg = small_config(tmp)
    cfg.trainer.batch_size, cfg.trainer.device = BATCH, "cpu"
    return cfg


def _train_each_precision(rank, world, cfg, tmp):
    """One group per precision (each its own stores), one after the other in the same ranks."""
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    batch = split(synthetic(cfg, N_EVENTS), rank, world)
    all_ids = {f: np.unique(synthetic(cfg, N_EVENTS).sparse[f].values) for f in cfg.model.field_names}
    out = {}
    for p in PRECISIONS + ("fp16-overflow",):
        c = copy.deepcopy(cfg)
        c.trainer.exchange_precision = c.trainer.dense_allreduce_precision = p.partition("-")[0]
        torch.manual_seed(0)
        store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model), torch.device("cpu"), path=str(tmp / f"store-{p}-{rank}"))
        core = ShardedTrainerCore(c.model, c.trainer, store, torch.device("cpu"), rank, world,
                                  store_cfg=c.store, join=c.join)
        if p == "fp16-overflow":
            core.dense_scale = 2.0 ** 40  # every rank: the first steps' fp16 sums overflow and are summed in fp32
        res = core.train_window(batch)
        owned = {f: ids[owner_of(f, ids, world) == rank] for f, ids in all_ids.items()}
        g = core.group_metrics()
        ex = core.exchange
        out[p] = {"auc": g.auc, "logloss": g.logloss, "steps": core.steps, "rejected": len(res.rejected),
                  "exchange_bytes": ex.bytes_sent, "remote_ids": ex.remote_ids_sent, "dense_bytes": core.dense_bytes_sent,
                  "retries": core.dense_fp32_retries, "params": sum(q.numel() for q in core.model.parameters()),
                  "dense": {k: v.detach().numpy().copy() for k, v in core.model.state_dict().items()},
                  "rows": {f: store.peek(f, ids).numpy() for f, ids in owned.items()}}
        store.close()
    return out


def _rel_diff(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all the arrays of two same-keyed dicts."""
    num = sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in b)
    return (num / sum(float(np.sum(b[k].astype(np.float64) ** 2)) for k in b)) ** 0.5


@pytest.mark.subprocess
@pytest.mark.timeout(500)  # above the shared group's own wait (group_runs: 400 s for the ranks, then their joins)
@GROUP_RUNS_WORKER
def test_a_compressed_wire_cuts_the_bytes_and_stays_near_fp32(tmp_path, group_runs):
    ranks = group_runs["precisions"]
    cfg = _cfg(tmp_path)
    dim, n_fields, world = cfg.model.embedding_dim, len(cfg.model.field_names), 2
    total = {p: {k: sum(r[p][k] for r in ranks) for k in ("exchange_bytes", "remote_ids", "dense_bytes", "retries")}
             for p in ranks[0]}
    f32 = ranks[0]["fp32"]
    steps, params = f32["steps"], f32["params"]
    assert steps == N_EVENTS // BATCH
    counts = world * steps * (world - 1) * (n_fields + 2) * 4  # every rank's counts message of every step
    for p, x in total.items():
        assert all(r[p]["rejected"] == 0 and r[p]["steps"] == steps for r in ranks), p
        # the same events ask for the same rows whatever the precision: only the bytes per row change
        assert x["remote_ids"] == total["fp32"]["remote_ids"] > 0
        # an id out, its row back, its gradient out (hashed 64-bit ids: int64 on the wire)
        per_id = 8 + 2 * wire_bytes_per_row(p.partition("-")[0], dim)
        assert x["exchange_bytes"] == x["remote_ids"] * per_id + counts, p
        wire = 4 if p == "fp32" else 2
        # a ring all-reduce of the gradients and the world + 1 flags per rank and step, plus sums redone in fp32
        ring = world * steps * 2 * (world - 1) * (params + world + 1) * wire // world
        assert x["dense_bytes"] == ring + x["retries"] * 2 * (world - 1) * params * 4 // world, p
    # the drop: rows and gradients at half the bytes (fp16: + one scale per row), the dense sum at half
    assert total["bf16"]["exchange_bytes"] < 0.6 * total["fp32"]["exchange_bytes"]
    assert total["bf16"]["dense_bytes"] * 2 == pytest.approx(total["fp32"]["dense_bytes"], rel=1e-3)
    assert total["fp16"]["retries"] == 0  # the starting scale does not overflow this model's sums
    assert total["fp16-overflow"]["retries"] >= 2  # ... a far too large one does (on both ranks), costing no event
    for r in ranks:
        f32 = r["fp32"]
        for p in ("bf16", "fp16", "fp16-overflow"):
            x = r[p]
            dense = _rel_diff(x["dense"], f32["dense"])
            rows = _rel_diff(x["rows"], f32["rows"])
            print(f"{p}: dAUC {x['auc'] - f32['auc']:+.5f} dlogloss {x['logloss'] - f32['logloss']:+.5f} "
                  f"dense {dense:.4f} rows {rows:.4f} (relative L2 distance from the fp32 group's)")
            assert abs(x["auc"] - f32["auc"]) <= AUC_TOL, (p, x["auc"], f32["auc"])
            assert abs(x["logloss"] - f32["logloss"]) <= LOGLOSS_TOL, p
            assert dense <= WEIGHT_TOL[p][0] and rows <= WEIGHT_TOL[p][1], (p, dense, rows)
    assert ranks[0]["bf16"]["auc"] == ranks[1]["bf16"]["auc"]  # one group, one figure
    for p in ranks[0]:  # every rank took the same dense steps, in any precision
        for k, v in ranks[0][p]["dense"].items():
            np.testing.assert_array_equal(ranks[1][p]["dense"][k], v, err_msg=f"{p} {k}")


def _exchange_small_and_large_ids(rank, world, cfg, tmp):
    """A RowExchange over in-memory tables: ids that fit int32 go as int32; one rank with a larger id
    makes the whole step int64. Rows come back exact (fp32) and gradients are summed at the owner."""
    from streamrec.trainer.sharding import RowExchange

    dim = 4
    applied = {}

    def lookup(table, ids):
        return torch.from_numpy(np.stack([ids.astype(np.float64) * 0.5 + k for k in range(dim)], 1).astype(np.float32))

    def apply_gradients(table, ids, grads):
        for i, gr in zip(ids.tolist(), grads.numpy()):
            applied[(table, i)] = applied.get((table, i), 0) + gr

    ex = RowExchange(["a", "b"], dim, lookup, apply_gradients, rank, world)
    out = []
    for big in (False, True):
        ids = np.arange(1, 200, dtype=np.int64) * (rank + 1)
        if big and rank == 1:
            ids = np.append(ids, 2 ** 40)
        before, remote_before = ex.bytes_sent, ex.remote_ids_sent
        rows, sizes = ex.fetch({"a": ids, "b": ids[:50]}, 10 + rank)
        for f, u in (("a", ids), ("b", ids[:50])):
            np.testing.assert_array_equal(rows[f].numpy(), lookup(f, u).numpy())
        ex.give_back({f: torch.ones_like(r) for f, r in rows.items()})
        out.append({"bytes": ex.bytes_sent - before, "remote": ex.remote_ids_sent - remote_before,
                    "sizes": sizes.tolist()})
    # every (table, id) asked for by both ranks got both ranks' gradient, summed, at its owner
    out.append({f"{t}:{i}": float(g[0]) for (t, i), g in applied.items()})
    return out


@pytest.mark.subprocess
@pytest.mark.timeout(500)  # above the shared group's own wait (group_runs: 400 s for the ranks, then their joins)
@GROUP_RUNS_WORKER
def test_ids_travel_as_int32_when_every_rank_s_ids_fit(group_runs):
    ranks = group_runs["ids"]
    dim, fields, world = 4, 2, 2
    counts = world * (world - 1) * (fields + 2) * 4
    for i, width in ((0, 4), (1, 8)):  # int32 ids; then one large id on one rank: int64 everywhere
        assert all(r[i]["sizes"] == [10, 11] for r in ranks)
        # summed over the ranks: every remote id goes out once, its row back, its gradient out
        assert sum(r[i]["bytes"] for r in ranks) == sum(r[i]["remote"] for r in ranks) * (width + 2 * 4 * dim) + counts
    for rank, (_, _, applied) in enumerate(ranks):
        for i in range(2, 200, 2):  # ids both ranks ask for (field a)
            if owner_of("a", np.array([i]), world)[0] == rank:
                assert applied[f"a:{i}"] == 4.0  # 2 ranks x 2 fetches, gradient 1 each, summed at the owner
            else:
                assert f"a:{i}" not in applied


def test_encoded_rows_round_trip_within_the_format_s_precision():
    x = torch.randn(500, 16) * torch.logspace(-30, 30, 500)[:, None]
    x[0] = 0
    for p, rel in (("fp32", 0.0), ("bf16", 2.0 ** -8), ("fp16", 2.0 ** -11)):
        y = encode_rows(x, p)
        assert y.element_size() * y.shape[1] == wire_bytes_per_row(p, 16)
        z = decode_rows(y, p)
        assert bool(torch.isfinite(z).all())
        scale = x.abs().amax(1, keepdim=True).clamp_min(1e-38)
        err = ((z - x).abs() / scale).amax()
        if p == "bf16":  # bf16 keeps fp32's range but not its subnormals: compare the normal rows
            err = ((z - x).abs() / scale)[x.abs().amax(1) > 1e-37].amax()
        assert float(err) <= rel, (p, float(err))
        assert float(z[0].abs().max()) == 0.0
    assert encode_rows(torch.zeros(0, 16), "fp16").shape == (0, 17)


def test_an_unknown_precision_is_refused_with_the_key_named(tmp_path):
    for key in ("exchange_precision", "dense_allreduce_precision"):
        with pytest.raises(ConfigError, match=key):
            load_config(None, {f"trainer.{key}": "int4"})


@pytest.fixture(scope="module")
def group_runs(tmp_path_factory):
    """The group scenarios of this file in one spawned group of two ranks, in turn (each with a config and a
    directory of its own): one spawn and rendezvous instead of one per test."""
    return run_group_scenarios(2, _cfg, tmp_path_factory.mktemp("compressed-group"), {
        "precisions": _train_each_precision,
        "ids": _exchange_small_and_large_ids,
    }, timeout=400.0)
