"""benchmarks/staleness.py: the remote row traffic of a trainer group with a K-step stale-read cache."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.staleness import config, row_traffic, speedup_bound
from streamrec.foundation import EventBatch, JaggedIds
from streamrec.trainer import owner_of

KS = (0, 1, 2, 4, 8, 16)


def test_synthetic_stream_savings_grow_with_staleness():
    cfg = config(2_000)
    res = row_traffic(cfg, 2_000, 2, KS)
    by = {d["k"]: d for d in res["by_k"]}
    assert sorted(by) == list(KS) and res["events"] == 2_000 and res["local_batch"] == 128
    k0 = by[0]
    assert k0["saved_fraction"] == 0.0 and k0["hit_rate"] == 0.0 and k0["fetches"] == k0["remote_reads"] > 0
    # every table of the default model is 16 wide: a remote read costs a row out and a gradient back, 2 x 64 B
    assert k0["row_bytes_per_event"] == pytest.approx(k0["remote_reads"] * 128 / 2_000)
    assert res["k0"]["row_bytes_per_event"] == k0["row_bytes_per_event"]
    assert res["k0"]["exchange_bytes_per_event"] > k0["row_bytes_per_event"]  # ids and the header on top
    assert sum(k0["per_rank_bytes_per_event"]) == pytest.approx(k0["exchange_bytes_per_event"])
    saved = [by[k]["saved_fraction"] for k in KS]
    assert all(b >= a for a, b in zip(saved, saved[1:])), saved
    assert saved[-1] > saved[1] > 0  # a skewed stream rereads its popular rows within a few steps
    for k in KS:  # one width: the bytes saved are the reads the cache served
        assert by[k]["saved_fraction"] == pytest.approx(by[k]["hit_rate"])
        assert by[k]["remote_reads"] == k0["remote_reads"]


def _repeating(cfg, n: int, period: int) -> EventBatch:
    """``n`` events whose ids depend only on the event's index modulo ``period``: every mini-batch of a
    multiple of ``period`` events holds the same ids."""
    sparse = {}
    for j, f in enumerate(cfg.generator.fields):
        slot = np.arange(n * f.multi) % (period * f.multi)
        sparse[f.name] = JaggedIds((slot + 1000 * j + 1).astype(np.int64),
                                   np.arange(0, n * f.multi + 1, f.multi, dtype=np.int64))
    return EventBatch(ts=np.arange(n, dtype=np.int64), labels=np.zeros(n, np.float32),
                      dense=np.zeros((n, cfg.model.dense_dim), np.float32), sparse=sparse)


def test_a_stream_repeating_its_ids_saves_all_but_one_fetch_per_k_plus_one_steps():
    cfg = config(4_096)
    # 8 messages of 512 events round-robin over 4 partitions: each of the 2 ranks gets 2,048 events, two windows
    # of 1,024, each planned as 8 mini-batches of 128: 16 steps per rank, each with the same ids
    batch = _repeating(cfg, 4_096, 8)
    res = row_traffic(cfg, 0, 2, (0, 1, 3, 15, 16, 100), batches=[batch], hot_set=False)
    assert res["steps"] == 16
    remote = 0  # per step, both ranks: the distinct ids each reads from the other rank
    for j, f in enumerate(cfg.generator.fields):
        ids = np.arange(8 * f.multi, dtype=np.int64) + 1000 * j + 1
        owners = owner_of(f.name, ids, 2)
        remote += int((owners != 0).sum() + (owners != 1).sum())
    by = {d["k"]: d for d in res["by_k"]}
    assert by[0]["remote_reads"] == by[0]["fetches"] == 16 * remote
    assert by[0]["row_bytes_per_event"] == pytest.approx(16 * remote * 128 / 4_096)
    for k, d in by.items():
        fetches = math.ceil(16 / (k + 1)) * remote  # fetched at steps 0, k+1, 2(k+1), ...
        assert d["fetches"] == fetches, k
        assert d["saved_fraction"] == pytest.approx(1 - fetches / (16 * remote))
    assert by[1]["saved_fraction"] == pytest.approx(0.5)
    assert by[16]["saved_fraction"] == by[100]["saved_fraction"] == pytest.approx(15 / 16)  # one fetch per rank


def test_speedup_bound_arithmetic():
    assert speedup_bound(200, 100, 100, 0.0) == 1.0
    assert speedup_bound(200, 100, 100, 0.5) == pytest.approx(400 / 300)
    assert speedup_bound(200, 100, 100, 1.0) == pytest.approx(2.0)
    assert speedup_bound(200, 0, 0, 1.0) == math.inf
    with pytest.raises(ValueError):
        speedup_bound(200, 100, 100, 1.5)
