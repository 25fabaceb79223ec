"""Checkpoints and resume: checkpoint directories appear whole (atomic rename) and old ones are
pruned; a resumed trainer continues its state (hot-set version, dead-letter and expired-row
totals) and sizes its hot tier by the configured budget, not the checkpoint's."""

from __future__ import annotations

import json

import numpy as np
import torch

from streamrec.app.wiring import trainer_settings
from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget
from streamrec.trainer.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint, write_checkpoint
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.service import TrainerService, open_store
from tests.conftest import small_config
from tests.helpers.trainer import produce, stream_cfg


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


def test_resume_uses_the_configured_hot_budget_not_the_checkpoints(tmp_path):
    """A resume sizes the hot tier by the configured hot.budget_rows, not by the checkpoint's: after the
    budget is raised, the first hot set of the new size fits (else StoreError in the loop, at every restart)."""
    cfg = small_config(tmp_path, **{"hot.budget_rows": 10})
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    store.set_hot({"user": np.arange(10)})
    ckpt = tmp_path / "ckpt-000000001"
    store.checkpoint(str(ckpt / "store"))
    store.close()
    cfg.hot.budget_rows = 50
    store = open_store(trainer_settings(cfg), torch.device("cpu"), ckpt)
    try:
        core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
        core.apply_hot_set(2, {"user": np.arange(30), "item": np.arange(20)})
        assert store.stats()["hot_rows"] == 50 and core.hot_rows == 50
    finally:
        store.close()


def test_sampled_hot_set_version_continues_after_a_resume(topics, tmp_path, bootstrap):
    """With hot_source 'sample' the hot-set version continues from the checkpoint after a resume: it never
    goes back to 1, and the resumed trainer does not count and migrate its first hot set again."""
    cfg = stream_cfg(topics, tmp_path)
    t = cfg.trainer
    t.hot_source, t.hot_sample_events, t.hot_refresh_events = "sample", 512, 0  # decide once
    t.log_path, t.log_every_s = str(tmp_path / "metrics.jsonl"), 0.2
    cfg.hot.budget_rows = 200
    produce(cfg, bootstrap, 2048)
    first = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    first.run()
    assert first.core.hot_version == 1
    produce(cfg, bootstrap, 1024)
    t.hot_refresh_events = 512  # the resumed trainer re-counts: its next set must be v2, not v1 again
    second = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    applied = []
    apply = second.core.apply_hot_set
    second.core.apply_hot_set = lambda version, tables: (applied.append(version), apply(version, tables))[1]
    assert second.core.hot_version == 1 and second.core.hot_rows == 200
    second.run()
    assert applied and applied[0] == 2, applied
    versions = [json.loads(x)["hot_version"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert versions == sorted(versions), versions


def test_dead_letter_and_expired_row_counts_survive_a_resume(topics, tmp_path, bootstrap):
    """The dead-letter and expired-row counts are totals in the metrics log: the checkpoint carries them
    and a resume continues from them instead of restarting at 0."""
    cfg = stream_cfg(topics, tmp_path)
    cfg.store.expire_after_s = 0.001  # the final checkpoint's sweep expires the untouched cold rows
    produce(cfg, bootstrap, 1024, bad=3)
    first = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    summary = first.run()
    assert summary["dead_letters"] == 3 and first.rows_expired > 0
    second = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    try:
        rec = second.emit()
        assert second.resumed_from and rec["dead_letters"] == 3 and rec["rows_expired"] == first.rows_expired
    finally:
        second.close()
