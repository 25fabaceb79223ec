"""The join state machine against an oracle written from the rules alone (docs/joining.md), over random
streams: out-of-order actions across partitions, duplicate impressions and actions, orphans, late and
after-window actions, other action types. The oracle reads each topic partition's own order; the machine is
fed a random interleaving of the two, and must emit exactly what the oracle says for every request_id, the
same for any interleaving and across a restart from its stored state."""

from __future__ import annotations

import random
import zlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.joiner import Action, JoinRules, JoinState

W, L, O = 100, 20, 50  # window, allowed lateness, orphan wait (ms)
H = W + L + O


def rules(mode: str, multi: bool) -> JoinRules:
    tasks = (("click", "click"), ("conversion", "conversion")) if multi else (("click", "click"),)
    return JoinRules(mode, W, L, O, tasks, single=not multi)


def make_streams(seed: int, partitions: int, n: int | None = None):
    """Per partition: the impressions topic's records and the actions topic's records, each in its own order
    (arrival = event time plus a random delay: out of order), with duplicates, orphans and late actions."""
    rnd = random.Random(seed)
    imps: dict[int, list] = {p: [] for p in range(partitions)}
    acts: dict[int, list] = {p: [] for p in range(partitions)}
    n = rnd.randint(0, 40) if n is None else n
    t0 = 1_000_000
    for i in range(n):
        rid = f"r{i}"
        p = zlib.crc32(rid.encode()) % partitions
        ts = t0 + rnd.randint(0, 600) + i * 5
        ev = {"ts": ts, "dense": [float(i)], "sparse": {"user": i}, "request_id": rid}
        has_imp = rnd.random() < 0.85  # else its actions are orphans
        if has_imp:
            for _ in range(1 + (rnd.random() < 0.2)):  # duplicates
                imps[p].append((ts + rnd.choice([0, 0, 0, rnd.randint(0, 250)]), rid, ts, ev))
        for _ in range(rnd.choice([0, 0, 1, 1, 2, 3])):
            typ = rnd.choice(["click", "click", "conversion", "view"])
            ats = ts + rnd.choice([rnd.randint(-5, W), rnd.randint(W - 10, W + 60), rnd.randint(0, 30)])
            a = Action(rid, ats, typ)
            for _ in range(1 + (rnd.random() < 0.2)):
                acts[p].append((ats + rnd.choice([0, 0, rnd.randint(0, 200)]), a))
    for p in range(partitions):  # each topic partition's order: by arrival time
        imps[p] = [(rid, ts, ev) for _, rid, ts, ev in sorted(imps[p], key=lambda x: (x[0], x[1]))]
        acts[p] = [a for _, a in sorted(acts[p], key=lambda x: (x[0], x[1].request_id, x[1].type))]
    return imps, acts


def oracle(r: JoinRules, imps: list, acts: list) -> Counter:
    """What the rules define for one partition: Counter of (rid, kind, labels as a sorted tuple)."""
    out: Counter = Counter()
    wi = None
    accepted: dict[str, tuple[int, int, dict]] = {}
    for rid, ts, ev in imps:
        wi = ts if wi is None else max(wi, ts)
        if ts + H < wi or rid in accepted:
            continue
        accepted[rid] = (ts, wi, ev)
    wa = None
    through = []
    for a in acts:
        wa = a.ts if wa is None else max(wa, a.ts)
        through.append((a, wa))
    names = [t for t, _ in r.tasks]
    for rid, (t, wi_i, _ev) in accepted.items():
        counted = set()
        for task, typ in r.tasks:
            for a, wa_a in through:
                if (a.request_id == rid and a.type == typ and a.ts <= t + W and wa_a <= t + W + L
                        and a.ts + O >= wi_i):
                    counted.add(task)
        closed = (wa is not None and wa > t + W + L) or (wi is not None and wi > t + H)
        if r.mode == "window":
            if len(counted) == len(names):
                out[(rid, "positive", tuple((n, 1) for n in names))] += 1
            elif closed:
                out[(rid, "negative", tuple((n, int(n in counted)) for n in names))] += 1
        else:
            out[(rid, "fake_negative", tuple((n, 0) for n in names))] += 1
            for task in names:
                if task in counted:
                    out[(rid, "positive", tuple((n, 1 if n == task else None) for n in names))] += 1
    return out


def as_key(r: JoinRules, ex) -> tuple:
    labels = {r.task_names[0]: ex.event["label"]} if r.single else ex.event["labels"]
    assert "request_id" in ex.event and ex.event["request_id"] == ex.request_id
    return (ex.request_id, ex.kind, tuple((n, labels[n]) for n in r.task_names))


def running_max(values: list[int]) -> list[int]:
    out, top = [], None
    for v in values:
        top = v if top is None else max(top, v)
        out.append(top)
    return out


def run(r: JoinRules, imps: list, acts: list, rnd: random.Random, restart_at: int = -1) -> Counter:
    """Feed one random interleaving in which the impressions never run more than the orphan wait ahead of the
    actions still to come (their running ts maxima): the interleavings a replay and a live run without
    stalled actions may take; at record ``restart_at`` start a new machine on the same store."""
    store: dict = {}
    m = JoinState(r, store)
    out: Counter = Counter()
    ki, ka = running_max([ts for _, ts, _ in imps]), running_max([a.ts for a in acts])
    i = j = k = 0
    while i < len(imps) or j < len(acts):
        if k == restart_at:
            m = JoinState(r, store)
        k += 1
        may_impression = i < len(imps) and (j >= len(acts) or ki[i] - O <= ka[j])
        if j >= len(acts) or (may_impression and rnd.random() < 0.5):
            rid, ts, ev = imps[i]
            i += 1
            exs = m.impression(rid, ts, ev)
        else:
            exs = m.action(acts[j])
            j += 1
        for ex in exs:
            out[as_key(r, ex)] += 1
    return out


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
@pytest.mark.parametrize("multi", [False, True])
@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), partitions=st.integers(1, 3), order=st.integers(0, 2**32 - 1))
def test_join_equals_oracle_for_every_interleaving(mode, multi, seed, partitions, order):
    r = rules(mode, multi)
    imps, acts = make_streams(seed, partitions)
    rnd = random.Random(order)
    for p in range(partitions):
        want = oracle(r, imps[p], acts[p])
        got = run(r, imps[p], acts[p], rnd)
        assert got == want
        again = run(r, imps[p], acts[p], rnd, restart_at=rnd.randint(0, len(imps[p]) + len(acts[p])))
        assert again == want
        if mode == "window":  # exactly one example per impression, once its window closed
            assert all(n == 1 for n in got.values())
            assert len({k[0] for k in got}) == len(got)


def test_rules_by_hand():
    """The cases the rules name, one by one, with the counters that say what happened."""
    r = rules("window", False)
    m = JoinState(r)
    ev = lambda rid, ts: {"ts": ts, "sparse": {"user": 1}, "request_id": rid}  # noqa: E731
    assert m.impression("a", 1000, ev("a", 1000)) == []
    pos = m.action(Action("a", 1050, "click"))  # in the window: a positive at once
    assert [(e.kind, e.event["label"]) for e in pos] == [("positive", 1)]
    assert m.action(Action("a", 1060, "click")) == [] and m.stats.duplicate_actions == 1
    assert m.impression("a", 1000, ev("a", 1000)) == [] and m.stats.duplicate_impressions == 1
    m.impression("b", 1010, ev("b", 1010))
    assert m.action(Action("b", 1010 + W + 1, "click")) == [] and m.stats.after_window_actions == 1
    assert m.action(Action("z", 1020, "click")) == []  # orphan: waits for its impression
    got = m.impression("z", 1015, ev("z", 1015))
    assert [(e.kind, e.event["label"]) for e in got] == [("positive", 1)]
    neg = m.action(Action("x", 1010 + W + L + 1, "view"))  # another type: only moves the watermark
    assert [(e.request_id, e.kind, e.event["label"]) for e in neg] == [("b", "negative", 0)]
    assert m.stats.ignored_actions == 1
    assert m.action(Action("b", 1020, "click")) == [] and m.stats.late_actions == 1
    m.action(Action("q", 1100, "click"))
    m.impression("late-trigger", 1100 + O + 1, ev("late-trigger", 1100 + O + 1))
    assert m.stats.orphan_actions == 1  # q's impression never came within the orphan wait
    assert m.impression("old", 1100 + O + 1 - H - 1, ev("old", 0)) == [] and m.stats.late_impressions == 1
    assert m.stats.examples == {"positive": 2, "negative": 1, "fake_negative": 0}


def test_fake_negative_emits_at_once_then_corrects():
    r = rules("fake_negative", False)
    m = JoinState(r)
    got = m.impression("a", 0, {"ts": 0, "request_id": "a"})
    assert [(e.kind, e.event["label"]) for e in got] == [("fake_negative", 0)]
    got = m.action(Action("a", 5, "click"))
    assert [(e.kind, e.event["label"]) for e in got] == [("positive", 1)]
    assert m.action(Action("zz", W + L + 10, "click")) == []  # the close emits nothing in this mode


def test_state_is_bounded_by_the_horizon():
    """Rows are freed once the impressions' watermark passes ts + window + lateness + orphan wait."""
    r = rules("window", False)
    store: dict = {}
    m = JoinState(r, store)
    for i in range(1000):
        t = i * 10
        m.impression(f"r{i}", t, {"ts": t, "request_id": f"r{i}"})
        m.action(Action(f"r{i}", t + 1, "click" if i % 3 == 0 else "view"))
    assert m.stats.rows == len(store) - 1  # every key but the watermark is a row
    assert m.stats.rows <= H // 10 + 3
