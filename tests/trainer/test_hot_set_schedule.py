"""How the trainer uses hot sets (FAE): which events are hot (all their ids in the hot tier), the
hot/cold mini-batch plan that trains every event exactly once, the top rows within a budget, and a
hot set over the budget cut to fit."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.ingest import EventBatch, JaggedIds, make_producer
from streamrec.trainer.hotset import top_rows
from streamrec.trainer.schedule import hot_samples, plan
from streamrec.trainer.service import TrainerService
from tests.helpers.trainer import produce, stream_cfg


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


def test_top_rows_respects_budget():
    counts = {"a": (np.array([1, 2, 3]), np.array([10, 1, 5])), "b": (np.array([7, 8]), np.array([8, 2]))}
    tables, cov = top_rows(counts, 3)
    assert {k: v.tolist() for k, v in tables.items()} == {"a": [1, 3], "b": [7]}
    assert cov == pytest.approx(23 / 26)


def test_a_hot_set_bigger_than_the_budget_is_cut_to_fit_instead_of_crashing(topics, tmp_path, bootstrap):
    """A hot-set message over the trainer's budget (the sketch ran with a bigger one, or the budget was
    lowered and the compacted topic still holds the old set) is cut to the budget. Raising instead would
    stop the loop, and again at every restart, since the follower re-reads the same message."""
    from streamrec.sketch import HotSet

    cfg = stream_cfg(topics, tmp_path)
    cfg.trainer.hot_source, cfg.hot.budget_rows = "topic", 40
    hs = HotSet(version=3, tables={"user": np.arange(60), "item": np.arange(40), "unknown": np.arange(9)},
                coverage=0.5, hit_rate=0.5)
    p = make_producer(bootstrap)
    p.send(cfg.kafka.hotset_topic, hs.to_bytes(), key=b"hot-set")
    p.flush(30)
    p.close()
    produce(cfg, bootstrap, 2048)
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    assert svc.hot.follower.wait_for(3, timeout=20) is not None
    summary = svc.run()
    assert summary["events"] == 2048
    assert svc.core.hot_version == 3 and svc.core.hot_rows == 40 and svc.last_record["hot_rows"] == 40
