"""Trainer without Kafka: metrics, FAE planning, learning, and equivalence with the
plain in-memory DLRM (same init, same row-wise Adagrad, same event order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import roc_auc
from streamrec.ingest import EventBatch, JaggedIds, SyntheticStream
from tests.conftest import small_config
from streamrec.trainer.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint, write_checkpoint
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.hotset import SampleHotSource, top_rows
from streamrec.trainer.metrics import StreamingMetrics
from streamrec.trainer.reference import MemoryDLRM
from streamrec.trainer.schedule import hot_samples, plan

BS = 256
WINDOW = BS * 8


def test_streaming_metrics_match_exact_auc():
    rng = np.random.default_rng(0)
    y = (rng.random(30_000) < 0.3).astype(np.float32)
    p = np.clip(0.3 + 0.2 * (y - 0.3) + rng.normal(0, 0.2, len(y)), 0.001, 0.999).astype(np.float32)
    m = StreamingMetrics(window=5000)
    for s in range(0, len(y), 777):
        m.update(y[s:s + 777], p[s:s + 777])
    assert abs(m.auc - roc_auc(y, p)) < 1e-3
    assert m.window_auc() == pytest.approx(roc_auc(y[-5000:], p[-5000:]), abs=1e-9)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert m.logloss == pytest.approx(ll, rel=1e-6)


def test_hot_samples_and_plan_interleave():
    j = JaggedIds(np.array([1, 2, 3, 9, 1], np.int64), np.array([0, 1, 3, 4, 4, 5], np.int64))
    b = EventBatch(ts=np.zeros(5, np.int64), labels=np.zeros(5, np.float32), dense=np.zeros((5, 0), np.float32),
                   sparse={"f": j})
    hot = hot_samples(b, ["f"], lambda f, ids: np.isin(ids, [1, 2, 3]))
    assert hot.tolist() == [True, True, False, True, True]  # event 3 has no ids: hot
    mbs = plan(np.array([True] * 6 + [False] * 2), batch_size=2, schedule="fae")
    assert [m.kind for m in mbs] == ["hot", "cold", "hot", "hot"] or [m.kind for m in mbs].count("cold") == 1
    rows = np.concatenate([m.rows for m in mbs])
    assert sorted(rows.tolist()) == list(range(8))  # every event exactly once
    assert [m.kind for m in plan(np.array([True, False] * 4), 2, "fae", hot_per_cold=1)] == ["hot", "cold"] * 2


def _data(tmp_path, n_train, n_held, **over):
    cfg = small_config(tmp_path, **{"trainer.batch_size": BS, "hot.budget_rows": 10_000, **over})
    s = SyntheticStream(cfg)
    allb = EventBatch.concat(list(s.batches(n_train + n_held)), cfg.model.dense_dim, cfg.model.field_names)
    return cfg, s, allb.take(np.arange(n_train)), allb.take(np.arange(n_train, n_train + n_held)), allb


def _train_core(cfg, train, hot=None) -> tuple[TrainerCore, EmbeddingStore]:
    store = EmbeddingStore.from_config(cfg, "cpu")
    core = TrainerCore(cfg, store, torch.device("cpu"))
    if hot is not None:
        core.apply_hot_set(1, hot)
    for s in range(0, len(train), WINDOW):
        core.train_window(train.take(np.arange(s, min(len(train), s + WINDOW))))
    return core, store


def test_learns_towards_bayes_auc(tmp_path):
    """Progressive AUC over the last 20k of 60k events reaches 0.7 of the way from 0.5 to the Bayes AUC."""
    cfg, s, train, _held, _ = _data(tmp_path, 61_440, 0)
    bayes = s.bayes_auc(61_440)
    core, store = _train_core(cfg, train)
    floor = 0.5 + 0.7 * (bayes - 0.5)
    assert core.metrics.window_auc() > floor, (core.metrics.window_auc(), bayes)
    assert core.metrics.logloss < 0.69
    store.close()


def test_equivalence_with_in_memory_dlrm(tmp_path):
    n_train, n_held = 40_960, 20_000
    cfg, _s, train, held, allb = _data(tmp_path, n_train, n_held)
    fields = cfg.model.field_names
    vocab = {f: np.unique(allb.sparse[f].values) for f in fields}
    ref = MemoryDLRM(cfg, vocab)
    for s in range(0, n_train, BS):
        ref.train_batch(train.take(np.arange(s, s + BS)))
    auc_ref = roc_auc(held.labels, ref.predict(held))

    results = {}
    for name in ("cold", "all_hot", "fae"):
        c = small_config(tmp_path / name, **{"trainer.batch_size": BS, "hot.budget_rows": 10_000})
        if name == "cold":
            hot = None
        elif name == "all_hot":
            hot = vocab
        else:  # FAE: hot set from a 20k-event sample, 1000 rows (about 13% of the rows seen)
            src = SampleHotSource(fields, budget=1000, sample_events=20_000)
            src.observe(train.take(np.arange(20_000)))
            hot = src.poll().tables
        core, store = _train_core(c, train, hot)
        results[name] = (roc_auc(held.labels, core.predict(held)), core.hot_events / core.events)
        store.close()
    assert results["cold"][1] == 0.0 and results["all_hot"][1] == 1.0
    assert 0.2 < results["fae"][1] < 0.95  # FAE really split the stream
    for name, (auc, _hf) in results.items():
        assert abs(auc - auc_ref) <= 0.002, (name, auc, auc_ref)
    # same batches in the same order: the tiers are float-exact with the in-memory table
    assert results["cold"][0] == auc_ref and results["all_hot"][0] == auc_ref


def test_top_rows_respects_budget():
    counts = {"a": (np.array([1, 2, 3]), np.array([10, 1, 5])), "b": (np.array([7, 8]), np.array([8, 2]))}
    tables, cov = top_rows(counts, 3)
    assert {k: v.tolist() for k, v in tables.items()} == {"a": [1, 3], "b": [7]}
    assert cov == pytest.approx(23 / 26)


def test_checkpoint_dirs_are_atomic_and_pruned(tmp_path):
    def store_writer(d):
        d.mkdir()
        (d / "x").write_text("1")
        return {"epoch": 1}

    for seq in range(1, 5):
        write_checkpoint(tmp_path, seq, {"offsets": [["t", 0, seq * 10]]}, {"w": torch.ones(2) * seq},
                         store_writer, keep=2)
    (tmp_path / "ckpt-000000009").mkdir()  # no state.json: incomplete, ignored
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    state, dense = read_checkpoint(latest_checkpoint(tmp_path))
    assert state["seq"] == 4 and state["offsets"] == [["t", 0, 40]] and float(dense["w"][0]) == 4.0
