"""Several tasks in TrainerCore (in process, real RocksDB store): a conversion task labelled on a tenth of the
events trains beside the click task without harming it, each task's progressive AUC counts only the events
that carry its label, and the window's scores are ``[N, T]``."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, hot_budget, roc_auc
from streamrec.foundation.model_config import TaskSpec
from streamrec.ingest import SyntheticStream
from streamrec.trainer import TrainerCore
from tests.conftest import small_config

N, BS = 32768, 256


def _events(cfg) -> EventBatch:
    """The synthetic click stream; ``conversion`` (the click itself: the stream's signal, learnable) labelled on
    10% of the events, NaN on the rest."""
    batch = EventBatch.concat(list(SyntheticStream(cfg).batches(N)), cfg.model.dense_dim, cfg.model.field_names)
    rng = np.random.default_rng(3)
    conv = batch.labels.copy()
    conv[rng.random(N) >= 0.1] = np.nan
    batch.task_labels = np.stack([batch.labels, conv], axis=1).astype(np.float32)
    return batch


def _train(tmp_path, name, tasks, events):
    cfg = small_config(tmp_path / name)
    cfg.trainer.batch_size = BS
    cfg.model.tasks = tasks
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    n = len(events)
    scores = [core.feed(events.take(np.arange(s, min(n, s + 8192)))).scores for s in range(0, n, 8192)]
    tail = core.flush()
    store.close()
    return core, np.concatenate(scores), tail


def test_a_rare_task_trains_beside_the_first_without_harming_it(tmp_path):
    """Conversion at loss weight 1, labelled on 10% of the events. The single-task baseline is the same model
    with the conversion weight at 0: the same architecture and initial weights, the click task trained alone.
    The click AUC stays within 0.01 of it: a rare task shares the rows and dense layers, so it may cost the click
    task a little (``bench quality --tasks`` measures how much); one whose loss outweighs its share of the
    labels (a masked mean over its own labelled events) costs several times that bound."""
    cfg = small_config(tmp_path)
    events = _events(cfg)
    two, scores, _ = _train(tmp_path, "two", [TaskSpec("click"), TaskSpec("conversion", 1.0)], events)
    unweighted = TaskSpec("conversion")
    unweighted.weight = 0.0  # past the config's check (a weight is > 0): the conversion head trains nothing
    alone, _, _ = _train(tmp_path, "alone", [TaskSpec("click"), unweighted], events)
    assert scores.shape == (N, 2)
    figures, base = two.task_figures(), alone.task_figures()
    labelled = ~np.isnan(events.task_labels[:, 1])
    assert figures["click"]["labelled"] == N and figures["conversion"]["labelled"] == int(labelled.sum())
    assert two.metrics is two.task_metrics["click"]
    # the conversion task learnt from a tenth of the labels; at weight 0 it did not learn at all
    assert figures["conversion"]["auc"] > 0.6 > base["conversion"]["auc"], (figures, base)
    # and the click task is what it is alone (the "does not harm")
    assert abs(figures["click"]["auc"] - base["click"]["auc"]) <= 0.01, (figures, base)
    # each task's progressive AUC is over the events with its label: the window's scores give the same figure
    # (exact AUC against the metrics' binned one)
    conv_auc = roc_auc(events.task_labels[labelled, 1], scores[labelled, 1])
    assert abs(conv_auc - figures["conversion"]["auc"]) < 0.002, (conv_auc, figures["conversion"]["auc"])


def test_a_single_task_core_scores_n_by_1_and_reports_as_before(tmp_path):
    cfg = small_config(tmp_path)
    events = _events(cfg).take(np.arange(4096))
    events.task_labels = None
    one, scores, _ = _train(tmp_path, "one", [TaskSpec("click")], events)
    assert scores.shape == (4096, 1) and one.task_figures()["click"]["labelled"] == one.metrics.count == 4096
    assert "task_metrics" in one.counters()


def test_task_metrics_survive_the_counters_round_trip(tmp_path):
    cfg = small_config(tmp_path)
    events = _events(cfg).take(np.arange(2048))
    core, _, _ = _train(tmp_path, "a", [TaskSpec("click"), TaskSpec("conversion")], events)
    c = small_config(tmp_path / "b")
    c.model.tasks = [TaskSpec("click"), TaskSpec("conversion")]
    store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model), "cpu")
    other = TrainerCore(c.model, c.trainer, store, torch.device("cpu"), store_cfg=c.store, join=c.join)
    other.load_counters(core.counters())
    store.close()
    assert other.task_figures() == core.task_figures() and other.task_figures()["conversion"]["labelled"] > 0
