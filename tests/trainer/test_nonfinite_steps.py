"""The trainer's numerical guard: a mini-batch whose loss or gradients are not finite
changes nothing, its poisoned events are set aside (the service dead-letters them),
and the rest of the batch trains."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.trainer import TrainerCore

from tests.conftest import small_config


def _core(tmp_path):
    cfg = small_config(tmp_path, **{"trainer.batch_size": 64, "hot.budget_rows": 0})
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    return cfg, store, TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"),
                                   store_cfg=cfg.store, join=cfg.join)


def test_an_event_with_a_huge_dense_value_is_rejected_and_the_rest_trains(tmp_path):
    cfg, store, core = _core(tmp_path)
    try:
        batch = next(iter(SyntheticStream(cfg).batches(256)))
        batch.dense[5, 0] = 3e38  # within float32, but the bottom MLP overflows to inf/NaN
        before = {k: v.clone() for k, v in core.model.state_dict().items()}
        res = core.train_window(batch)
        assert res.rejected.tolist() == [5]  # its mini-batch's other events are retried and trained
        assert "non-finite" in res.reject_reason
        assert core.nonfinite_batches >= 1 and core.rejected_events == len(res.rejected)
        assert core.events == len(batch) - len(res.rejected)
        for k, v in core.model.state_dict().items():
            assert torch.isfinite(v).all(), k
        assert any(not torch.equal(v, before[k]) for k, v in core.model.state_dict().items())  # it did train
        for f in cfg.model.field_names:
            ids = batch.sparse[f].values
            if len(ids):
                assert torch.isfinite(store.lookup(f, np.unique(ids))).all()
        # metrics never see the NaN scores: the AUC over the trained events (both labels present) is a number
        assert np.isfinite(core.metrics.auc) and 0.0 <= core.metrics.auc <= 1.0, core.metrics.auc
        assert core.metrics.count == len(batch) - len(res.rejected)
    finally:
        store.close()


def test_a_clean_window_rejects_nothing(tmp_path):
    cfg, store, core = _core(tmp_path)
    try:
        batch = next(iter(SyntheticStream(cfg).batches(256)))
        res = core.train_window(batch)
        assert len(res.rejected) == 0 and res.reject_reason == ""
        assert core.nonfinite_batches == 0 and core.events == len(batch)
        assert np.isfinite(res.scores).all()
    finally:
        store.close()
