"""Watermarks that move without actions: a partition whose actions stop still closes its windows as its
impressions move on, so no window stays open longer than ``window_s + allowed_lateness_s + orphan_wait_s``
of event time after the partition's impressions passed it; in window mode each such impression gets its
negative. Checked on the state machine after every record, and through the join task (its merge releases
the impressions once the stopped actions topic is caught up and quiet)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from streamrec.foundation import EventSchema
from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner.state_rows import IMPRESSION
from tests.joiner.join_task_fakes import join_all, kinds, logs_of
from tests.joiner.test_join_oracle import H, make_streams, oracle, rules
from tests.joiner.test_join_order import config


def open_since(store: dict) -> list[int]:
    """The event times of the impressions whose window is open."""
    return [v["ts"] for k, v in store.items() if k.startswith(IMPRESSION) and v["open"]]


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
def test_no_window_stays_open_when_a_partitions_actions_stop(mode):
    r = rules(mode, False)
    store: dict = {}
    m = JoinState(r, store)
    out: Counter = Counter()
    for i in range(3000):
        t = 1_000 + i * 3
        for ex in m.impression(f"r{i}", t, {"ts": t, "request_id": f"r{i}"}):
            out[(ex.request_id, ex.kind, ex.event["label"])] += 1
        if i < 500 and i % 4 == 0:  # the actions stop after the first 500 impressions
            for ex in m.action(Action(f"r{i}", t + 10, "click")):
                out[(ex.request_id, ex.kind, ex.event["label"])] += 1
        assert all(m.wi - ts <= H for ts in open_since(store)), "a window open past the horizon"
    assert m.stats.rows <= H // 3 + 3  # and the rows are freed
    if mode == "window":  # every impression the impressions moved past has its one example
        passed = [i for i in range(3000) if 1_000 + i * 3 + H < m.wi]
        per_request: Counter = Counter()
        for (rid, _, _), n in out.items():
            per_request[rid] += n
        assert all(per_request[f"r{i}"] == 1 for i in passed)
        assert out[("r4", "positive", 1)] == 1 and out[("r5", "negative", 0)] == 1
        assert out[("r2000", "negative", 0)] == 1


def test_the_join_task_closes_the_windows_of_a_partition_whose_actions_stopped(tmp_path):
    """Window mode through the join task: the actions topic holds only the actions before a cut; every impression
    the impressions' watermark left more than the horizon behind gets its example, the oracle's."""
    cfg = config(tmp_path, 300.0)
    cfg.join.mode = "window"
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(4, 2, n=1500)
    cut = {p: [a for a in acts[p] if a.ts < 1_000_000 + 1500] for p in acts}  # the actions stop early
    want = sum((oracle(r, imps[p], cut[p]) for p in imps), Counter())
    wi = {p: max(ts for _, ts, _ in imps[p]) for p in imps}
    closed_by_impressions = sum(1 for p in imps for rid, ts, _ in imps[p] if ts + H < wi[p] and ts > 1_000_000 + 2000)
    assert closed_by_impressions > 500  # windows only the impressions' watermark can close
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    out = asyncio.run(join_all(cfg, schema, logs_of(cfg, imps, cut), cfg.join.impressions_topic, sum(want.values())))
    assert kinds(out) == want
