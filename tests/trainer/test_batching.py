"""The event batcher's rules, on hot/cold flags alone (no model): full-size batches, the bounded wait
of a hot event for a full hot batch (then it trains with the cold ones), the hard ``max_wait`` bound,
no-peek prescoring, and batch boundaries that depend only on the event sequence."""

from __future__ import annotations

import numpy as np

from streamrec.foundation import EventBatch, JaggedIds
from streamrec.trainer.batching import EventBatcher

FIELDS = ["user"]


def _events(n: int, start: int = 0) -> EventBatch:
    one = np.arange(n + 1, dtype=np.int64)
    ids = np.arange(start, start + n, dtype=np.int64)
    return EventBatch(ids.copy(), np.zeros(n, np.float32), np.zeros((n, 1), np.float32), {"user": JaggedIds(ids, one)})


def _plan(hot: np.ndarray, chunks: list[int], bs: int = 8, max_wait: int = 64, hot_wait: int | None = 16):
    """Feed events with these hot flags in ``chunks`` (cycled), drain; steps as (kind, arrival numbers, prescored)."""
    b = EventBatcher(bs, max_wait, 1, FIELDS, hot_wait=hot_wait)
    out, s, i = [], 0, 0
    while s < len(hot):
        k = chunks[i % len(chunks)]
        e = min(len(hot), s + k)
        steps = b.add(_events(e - s, s), hot[s:e])
        out += [(st.kind, b.seq[st.rows].tolist(), b.seq[st.prescore].tolist()) for st in steps]
        b.retire()
        s, i = e, i + 1
    out += [(st.kind, b.seq[st.rows].tolist(), b.seq[st.prescore].tolist()) for st in b.drain()]
    return out


def _sparse_hot(n: int, every: int) -> np.ndarray:
    hot = np.zeros(n, bool)
    hot[every // 2::every] = True
    return hot


def test_every_event_trains_once_and_the_batches_do_not_depend_on_delivery():
    rng = np.random.default_rng(0)
    hot = rng.random(3000) < 0.3
    hot[1000:1200] = True  # a burst: full hot batches form in it
    ref = _plan(hot, [3000])
    for chunks in ([1], [7, 1, 300], [64], [999, 2]):
        assert _plan(hot, chunks) == ref
    trained = np.sort(np.concatenate([r for _, r, _ in ref]))
    assert np.array_equal(trained, np.arange(len(hot)))
    assert {k for k, _, _ in ref} == {"hot", "cold"}


def test_sparse_hot_events_train_in_arrival_order_without_waiting():
    """1 in 10 hot: a full hot batch (8) would take 71 arrivals, over hot_wait=16; hot events are not held."""
    hot = _sparse_hot(800, 10)
    steps = _plan(hot, [800], bs=8, max_wait=64, hot_wait=16)
    assert [(k, r) for k, r, _ in steps] == [("cold", list(range(s, s + 8))) for s in range(0, 800, 8)]
    assert all(not pre for _, _, pre in steps)


def test_a_hot_batch_that_does_not_fill_in_time_trains_in_a_full_cold_batch():
    """A burst of 12 hot events opens the gate (8 of the last 16 arrivals hot) for its last 4, which then wait
    for a hot batch that never fills: after hot_wait arrivals they join the cold queue, in arrival order."""
    hot = np.zeros(200, bool)
    hot[50:62] = True
    steps = _plan(hot, [200], bs=8, max_wait=64, hot_wait=16)
    assert all(k == "cold" and len(r) == 8 for k, r, _ in steps)  # no fragment, no hot step
    for e in range(58, 62):  # the events held for a hot batch
        late = next(r for _, r, _ in steps if e in r)
        assert late == sorted(late)
        assert e + 16 <= max(late) <= e + 16 + 8  # moved after hot_wait arrivals, trained in the next full batch
    before = next(r for _, r, _ in steps if 57 in r)
    assert 58 not in before and max(before) > 58  # it was held: a later event trained first


def test_with_the_old_rule_the_same_stream_trains_partial_hot_batches():
    """hot_wait >= max_wait: the hot queue trains as it is once its oldest event waited max_wait."""
    hot = _sparse_hot(800, 10)
    steps = _plan(hot, [800], bs=8, max_wait=64, hot_wait=None)
    hot_steps = [r for k, r, _ in steps if k == "hot"]
    assert hot_steps and all(len(r) < 8 for r in hot_steps)  # fragments: 7 hot events in 64 arrivals


def test_dense_hot_events_still_form_full_store_free_hot_batches():
    hot = _sparse_hot(800, 2)  # half the events hot: 8 hot events in 16 arrivals, within hot_wait=20
    steps = _plan(hot, [800], bs=8, max_wait=64, hot_wait=20)
    hot_rows = [r for k, rows, _ in steps if k == "hot" for r in rows]
    # every hot event trained in a hot batch, but the first two (arrivals 1 and 3: the hot rate so far, 0/1 and
    # 1/3, would not fill a batch within hot_wait)
    assert hot_rows == np.flatnonzero(hot)[2:].tolist()
    hot_steps = [r for k, r, _ in steps if k == "hot"]
    assert all(len(r) == 8 for r in hot_steps[:-1])  # full-size, but the drain's at the end of the stream


def test_no_event_waits_beyond_max_wait_and_waiting_events_are_scored_before_a_later_one_trains():
    rng = np.random.default_rng(1)
    hot = rng.random(2000) < 0.9  # cold events are rare: the cold queue trains partial after max_wait
    steps = _plan(hot, [13, 500], bs=8, max_wait=40, hot_wait=16)
    scored: set[int] = set()
    trained: set[int] = set()
    for _, rows, pre in steps:
        newest = max(rows)
        assert not set(pre) & trained and not set(pre) & set(rows)
        scored |= set(pre)
        waiting_older = {e for e in range(newest) if e not in trained and e not in rows}
        assert waiting_older <= scored  # nothing that arrived earlier is left unscored while a later event trains
        trained |= set(rows)
        if len(steps) and rows is not steps[-1][1]:
            assert newest - min(rows) <= 40
    assert any(len(r) < 8 for k, r, _ in steps[:-2] if k == "cold")  # the max_wait rule did fire


def test_a_batcher_restored_from_its_state_forms_the_same_batches():
    """A checkpoint holds the waiting events, their queues and the gate's recent hot flags: a trainer resumed
    from it continues exactly as one that never stopped."""
    rng = np.random.default_rng(2)
    hot = rng.random(1500) < 0.4  # near the gate's threshold (8 of 20): it opens and closes
    hot[600:700] = False  # a gap: a hot batch waiting then spills
    ref = _plan(hot, [1500], bs=8, max_wait=64, hot_wait=20)
    b = EventBatcher(8, 64, 1, FIELDS, hot_wait=20)
    out = []
    cuts = [0, 113, 250, 613, 777, 1001, 1400, 1500]
    for lo, hi in zip(cuts, cuts[1:]):
        steps = b.add(_events(hi - lo, lo), hot[lo:hi])
        out += [(st.kind, b.seq[st.rows].tolist(), b.seq[st.prescore].tolist()) for st in steps]
        b.retire()
        st = b.state()
        b = EventBatcher(8, 64, 1, FIELDS, hot_wait=20)
        b.load_state(st)
    out += [(st.kind, b.seq[st.rows].tolist(), b.seq[st.prescore].tolist()) for st in b.drain()]
    assert out == ref
    assert any(k == "hot" for k, _, _ in ref) and any(k == "cold" for k, _, _ in ref)


def test_without_early_scores_the_steps_are_the_same_and_nothing_is_scored_early():
    """``early_scores = False`` (the bench's diagnostic of what they cost) changes no step, only drops the
    early scores; by default a stream whose hot events wait does score some early."""
    rng = np.random.default_rng(4)
    hot = rng.random(2000) < 0.6

    def plan(early: bool):
        b = EventBatcher(8, 64, 1, FIELDS, hot_wait=32)
        b.early_scores = early
        steps = b.add(_events(len(hot)), hot) + b.drain()
        return [(st.kind, st.rows.tolist(), st.prescore.tolist()) for st in steps]

    on, off = plan(True), plan(False)
    assert [(k, r) for k, r, _ in on] == [(k, r) for k, r, _ in off]
    assert sum(len(p) for _, _, p in on) > 0
    assert all(not p for _, _, p in off)
