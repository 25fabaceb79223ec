"""Adversarial review of the trainer: each test reproduced a defect before its fix."""

from __future__ import annotations

import numpy as np
import torch

from embedding_store import EmbeddingStore
from ingest import SyntheticStream
from tests.conftest import small_config
from trainer.core import TrainerCore
from trainer.service import open_store


def test_resume_uses_the_configured_hot_budget_not_the_checkpoints(tmp_path):
    """Raising hot.budget_rows and restarting used to keep the checkpoint's smaller hot tier, so the
    first hot set of the new size raised StoreError in the loop: a crash at every restart."""
    cfg = small_config(tmp_path, **{"hot.budget_rows": 10})
    store = EmbeddingStore.from_config(cfg, "cpu")
    store.set_hot({"user": np.arange(10)})
    ckpt = tmp_path / "ckpt-000000001"
    store.checkpoint(str(ckpt / "store"))
    store.close()
    cfg.hot.budget_rows = 50
    store = open_store(cfg, torch.device("cpu"), ckpt)
    try:
        core = TrainerCore(cfg, store, torch.device("cpu"))
        core.apply_hot_set(2, {"user": np.arange(30), "item": np.arange(20)})
        assert store.stats()["hot_rows"] == 50 and core.hot_rows == 50
    finally:
        store.close()
