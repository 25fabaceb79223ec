"""Training without Kafka: the model learns towards the generator's Bayes-optimal AUC, and the tiered
trainer (cold, all hot, FAE's split) is equivalent to the plain in-memory DLRM (same init, same
row-wise Adagrad, same event order): float-exact when every row sits in one tier."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget, roc_auc
from streamrec.ingest import EventBatch, SyntheticStream
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.hotset import SampleHotSource
from streamrec.trainer.reference import MemoryDLRM
from tests.conftest import small_config

BS = 256
WINDOW = BS * 8


def _data(tmp_path, n_train, n_held, **over):
    cfg = small_config(tmp_path, **{"trainer.batch_size": BS, "hot.budget_rows": 10_000, **over})
    s = SyntheticStream(cfg)
    allb = EventBatch.concat(list(s.batches(n_train + n_held)), cfg.model.dense_dim, cfg.model.field_names)
    return cfg, s, allb.take(np.arange(n_train)), allb.take(np.arange(n_train, n_train + n_held)), allb


def _train_core(cfg, train, hot=None) -> tuple[TrainerCore, EmbeddingStore]:
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    if hot is not None:
        core.apply_hot_set(1, hot)
    for s in range(0, len(train), WINDOW):  # as the service does: batches form across the windows
        core.feed(train.take(np.arange(s, min(len(train), s + WINDOW))))
    core.flush()
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
    # the dense lr the 0.005 FAE bound below was set at; at the default 3e-3 (chosen in issue #17's sweep) FAE
    # read 0.0061 below the in-memory DLRM on this stream, one seed (BENCHMARKS.md, quality)
    lr = 1e-3
    cfg.trainer.dense_lr = lr
    fields = cfg.model.field_names
    vocab = {f: np.unique(allb.sparse[f].values) for f in fields}
    ref = MemoryDLRM(cfg.model, cfg.trainer, cfg.store, vocab)
    for s in range(0, n_train, BS):
        ref.train_batch(train.take(np.arange(s, s + BS)))
    auc_ref = roc_auc(held.labels, ref.predict(held)[:, 0])

    results = {}
    for name in ("cold", "all_hot", "fae"):
        c = small_config(tmp_path / name, **{"trainer.batch_size": BS, "hot.budget_rows": 10_000,
                                             "trainer.dense_lr": lr})
        if name == "cold":
            hot = None
        elif name == "all_hot":
            hot = vocab
        else:  # FAE: hot set from a 20k-event sample, 1000 rows (about 13% of the rows seen)
            src = SampleHotSource(fields, budget=1000, sample_events=20_000)
            src.observe(train.take(np.arange(20_000)))
            hot = src.poll().tables
        core, store = _train_core(c, train, hot)
        results[name] = (roc_auc(held.labels, core.predict(held)[:, 0]), core.hot_events / core.events)
        store.close()
    assert results["cold"][1] == 0.0 and results["all_hot"][1] == 1.0
    assert 0.2 < results["fae"][1] < 0.95  # FAE really split the stream
    for name, (auc, _hf) in results.items():
        # FAE forms other batches (full-size hot ones), and on this stream shifting batch boundaries by a
        # few events alone moves the AUC by ~0.003: FAE is held to 0.005, the one-batching tiers to float-exact
        assert abs(auc - auc_ref) <= (0.005 if name == "fae" else 0.002), (name, auc, auc_ref)
    # same batches in the same order: the tiers are float-exact with the in-memory table
    assert results["cold"][0] == auc_ref and results["all_hot"][0] == auc_ref
