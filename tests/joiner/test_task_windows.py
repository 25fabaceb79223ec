"""A window per task (``join.task_actions = "click=click,conversion=purchase@86400"``): an action counts for a
task when it falls in that task's window; in window mode the impression's example waits for every task's
action or for the longest window's close; in fake_negative mode each task's positive comes when its action
counts; the dedupe horizon is the longest window's. Without ``@`` every task has ``join.window_s``."""

from __future__ import annotations

import heapq
from collections import Counter

import pytest

from streamrec.foundation.config import InvalidValue
from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner.join_config import JoinConfig
from tests.joiner.test_join_oracle import make_streams, oracle

CW, VW, L, O = 100, 1000, 20, 50  # click window, conversion window, lateness, orphan wait (ms)
T = 1_000_000


def two_windows(mode: str) -> JoinRules:
    return JoinRules(mode, CW, L, O, (("click", "click"), ("conversion", "purchase")), single=False,
                     windows=(CW, VW))


def feed(m: JoinState, records: list) -> list[tuple[str, str, dict]]:
    """``records``: ("i", rid, ts) impressions and ("a", rid, ts, type) actions, in this order; the examples as
    ``(request_id, kind, labels)``."""
    out = []
    for rec in records:
        if rec[0] == "i":
            exs = m.impression(rec[1], rec[2], {"ts": rec[2], "request_id": rec[1]})
        else:
            exs = m.action(Action(rec[1], rec[2], rec[3]))
        out += [(ex.request_id, ex.kind, ex.event["labels"]) for ex in exs]
    return out


def test_config_parses_a_window_per_task():
    j = JoinConfig(task_actions="click=click, conversion=purchase@86400", window_s=3600.0)
    assert j.tasks == {"click": "click", "conversion": "purchase"}
    assert j.task_windows == {"click": 3600.0, "conversion": 86400.0} and j.longest_window_s == 86400.0
    r = JoinRules.from_config(j)
    assert r.task_windows == {"click": 3_600_000, "conversion": 86_400_000}
    assert r.close_ms == 86_400_000 + 60_000 and r.horizon_ms == 86_400_000 + 60_000 + 300_000
    plain = JoinRules.from_config(JoinConfig(window_s=2.5))
    assert plain.task_windows == {"click": 2500} and plain.horizon_ms == 2500 + 60_000 + 300_000


@pytest.mark.parametrize("item", ["conversion=purchase@0", "conversion=purchase@-5", "conversion=purchase@abc",
                                  "conversion=purchase@", "conversion=purchase@nan", "conversion=purchase@inf"])
def test_config_refuses_a_bad_task_window(item):
    with pytest.raises(InvalidValue) as e:
        JoinConfig(task_actions=f"click=click,{item}")
    msg = str(e.value)
    assert "task_actions" in msg and item in msg and "positive number" in msg and "\n" not in msg


def test_window_mode_waits_for_the_longest_window():
    m = JoinState(two_windows("window"))
    out = feed(m, [("i", "both", T), ("i", "click_only", T + 1), ("i", "late_click", T + 2),
                   ("a", "both", T + 50, "click"), ("a", "click_only", T + 11, "click"),
                   ("a", "late_click", T + 2 + 150, "click"),  # past the click window, inside the conversion one
                   ("a", "both", T + 500, "purchase")])
    assert out == [("both", "positive", {"click": 1, "conversion": 1})]  # its every task has its action
    assert m.stats.after_window_actions == 1
    assert feed(m, [("a", "x", T + 1 + CW + L + 5, "view")]) == []  # the click window closed, the impression's not
    out = feed(m, [("a", "late_click", T + 900, "click"), ("a", "x", T + 2 + VW + L + 1, "view")])
    assert m.stats.after_window_actions == 2  # a click at +900 is past the click window: not late, after it
    assert sorted(out) == [("click_only", "negative", {"click": 1, "conversion": 0}),
                           ("late_click", "negative", {"click": 0, "conversion": 0})]


def test_an_action_is_late_when_its_own_tasks_window_closed():
    m = JoinState(two_windows("window"))
    feed(m, [("i", "r", T), ("a", "other", T + CW + L + 5, "purchase")])  # wa passes the click window's close
    assert feed(m, [("a", "r", T + 90, "click")]) == [] and m.stats.late_actions == 1  # in its window, too late
    assert feed(m, [("a", "r", T + 400, "purchase")]) == [] and m.stats.late_actions == 1  # counts: still open
    out = feed(m, [("a", "y", T + VW + L + 1, "view")])
    assert out == [("r", "negative", {"click": 0, "conversion": 1})]


def test_fake_negative_mode_writes_each_tasks_positive_when_its_action_counts():
    m = JoinState(two_windows("fake_negative"))
    out = feed(m, [("i", "r", T), ("a", "r", T + 150, "click"), ("a", "r", T + 700, "purchase"),
                   ("a", "r", T + 800, "click")])
    assert out == [("r", "fake_negative", {"click": 0, "conversion": 0}),
                   ("r", "positive", {"click": None, "conversion": 1})]
    assert m.stats.after_window_actions == 2
    out = feed(m, [("i", "s", T + 900), ("a", "s", T + 950, "click")])
    assert out == [("s", "fake_negative", {"click": 0, "conversion": 0}),
                   ("s", "positive", {"click": 1, "conversion": None})]


def test_the_dedupe_horizon_is_the_longest_windows():
    m = JoinState(two_windows("window"))
    feed(m, [("i", "r", T), ("i", "newer", T + VW + L + O - 1)])
    assert m.stats.late_impressions == 0
    feed(m, [("i", "r", T)])  # inside the longest window's horizon: still recognised
    assert m.stats.duplicate_impressions == 1 and m.stats.late_impressions == 0
    feed(m, [("i", "newest", T + VW + L + O + 10), ("i", "r", T)])
    assert m.stats.late_impressions == 1


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
@pytest.mark.parametrize("seed", range(6))
def test_every_task_at_the_common_window_joins_as_without_windows(mode, seed):
    from tests.joiner.test_join_oracle import rules

    plain = rules(mode, True)
    explicit = JoinRules(plain.mode, plain.window_ms, L, O, plain.tasks, single=False,
                         windows=(plain.window_ms,) * len(plain.tasks))
    imps, acts = make_streams(seed, 1, n=200)
    records = heapq.merge([("i", rid, ts) for rid, ts, _ in imps[0]], [("a", a.request_id, a.ts, a.type)
                                                                       for a in acts[0]], key=lambda x: x[2])
    records = list(records)  # both topics in their own order, interleaved near event time
    got = {}
    for r in (plain, explicit):
        got[r.windows] = Counter((rid, kind, tuple(sorted(labels.items())))
                                 for rid, kind, labels in feed(JoinState(r), records))
    assert got[()] == got[explicit.windows]
    assert sum(1 for _, _, labels in got[()] if 1 in dict(labels).values()) >= 5
    assert sum(got[()].values()) == sum(oracle(plain, imps[0], acts[0]).values())
