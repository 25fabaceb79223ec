"""The trainer's field contribution (``trainer/contribution.py``): scored before the events are trained, on a
bounded uniform sample of the window, a field that ranks has a positive contribution with a small paired
SE, a field whose ids no longer belong to their events none; and it reaches the snapshot's evidence through
the collector attached to a real trainer core."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.app.config import load_config
from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, JaggedIds, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.snapshot import read_evidence
from streamrec.trainer import TrainerCore, collector_for
from streamrec.trainer.contribution import ContributionMeter, without_each_field


def _batch(n, rng, misaligned=False):
    """Labels follow the item (even ids click far more); with ``misaligned`` the item ids are another event's."""
    item = rng.integers(0, 100, n)
    y = (rng.random(n) < np.where(item % 2 == 0, 0.7, 0.1)).astype(np.float32)
    if misaligned:
        item = rng.permutation(item)
    offs = np.arange(n + 1, dtype=np.int64)
    return EventBatch(ts=np.zeros(n, np.int64), labels=y, dense=rng.normal(size=(n, 1)).astype(np.float32),
                      sparse={"user": JaggedIds(rng.integers(0, 50, n).astype(np.int64), offs),
                              "item": JaggedIds(item.astype(np.int64), offs)})


def _predict(batch):
    """A model that learnt the item's effect: even ids score high; no item id scores the average."""
    j = batch.sparse["item"]
    score = np.full(len(batch), 0.4)
    has = j.lengths > 0
    score[has] = np.where(j.values % 2 == 0, 0.7, 0.1)
    return (score + 0.01 * batch.dense[:, 0])[:, None]


def test_without_each_field_removes_one_field_per_copy():
    b = _batch(5, np.random.default_rng(0))
    w = without_each_field(b, ["user", "item"])
    assert len(w) == 15 and np.array_equal(w.dense[10:], b.dense)
    assert list(w.sparse["user"].lengths) == [1] * 5 + [0] * 5 + [1] * 5
    assert list(w.sparse["item"].lengths) == [1] * 10 + [0] * 5


def test_a_ranking_field_contributes_and_a_misaligned_one_does_not_within_the_bound():
    rng = np.random.default_rng(1)
    scored = []
    m = ContributionMeter(["user", "item"], lambda b: scored.append(len(b)) or _predict(b), cap=512)
    m.observe([_batch(400, rng) for _ in range(5)])  # one call: 2000 events, at most 512 scored
    assert sum(scored) == 512 * 3  # as is, and once per field removed
    for _ in range(20):
        m.observe([_batch(100, rng)])
    assert sum(scored) < 3 * 512 * 3  # bottom-k: few of the later events enter the sample
    out = m.take()
    assert out["item"].events == 512 and out["item"].contribution > 0.2 and out["item"].se < 0.05
    assert abs(out["user"].contribution) < 1e-9  # the model ignores it
    m.observe([_batch(1000, rng, misaligned=True)])
    bad = m.take()["item"]
    assert abs(bad.contribution) < 3 * bad.se + 0.02 and bad.contribution < out["item"].contribution - 0.15
    assert m.take() == {}  # nothing since the last take


def test_the_collector_on_a_real_core_puts_the_contribution_into_the_evidence(tmp_path):
    cfg = load_config(None, {}, env={})
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    collector = collector_for(cfg.model, cfg.trainer.metrics_window, core)
    seen = []
    observe = core.before_training
    core.before_training = lambda subs: seen.append(core.events) or observe(subs)
    events = EventBatch.concat(list(SyntheticStream(cfg).batches(3000)), cfg.model.dense_dim, cfg.model.field_names)
    core.feed(events, flush=True)
    assert seen and seen[0] == 0  # measured before the events of the call were trained
    ev = read_evidence(collector.take(0).to_block())
    assert set(ev.field_contribution) == set(cfg.model.field_names)
    for c in ev.field_contribution.values():
        assert c.events == 1024 and 0 <= c.se < 0.1 and -1 <= c.contribution <= 1
