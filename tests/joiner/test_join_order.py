"""Event-time order: the join task merges each partition's impressions and actions by event time, so a
positive follows its fake negative by about as many examples as event time puts between them, whatever
order the reader fetches the two topics in (here the worst: every impression of a backlog before any
action), and still writes exactly the oracle's examples. The same fetch order without the merge
(``join.merge_wait_ms = 0``) moves the impressions' watermark past every window before its actions are read:
the actions count as late and their positives are lost, so the labels are what the merge keeps."""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter

import pytest

from streamrec.foundation import EventSchema
from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner.join_clients import ID_HEADER
from tests.conftest import small_config
from tests.joiner.join_task_fakes import EVENTS, join_all, kinds, logs_of
from tests.joiner.test_join_oracle import make_streams, oracle

P = 2
SLACK = 256  # examples a positive may come later than event time puts it


def config(tmp_path, wait_ms: float):
    cfg = small_config(tmp_path)
    cfg.join.mode = "fake_negative"
    cfg.join.window_s, cfg.join.allowed_lateness_s, cfg.join.orphan_wait_s = 0.1, 0.02, 0.05  # the oracle's
    cfg.join.batch_records = 100
    cfg.join.merge_wait_ms = wait_ms
    cfg.kafka.codec = "json"
    cfg.kafka.events_topic = EVENTS
    return cfg


def distances(seq: list[tuple[int, str, str]]) -> dict[tuple[int, str], int]:
    """Per (partition, request id) with a positive: examples of its partition between its fake negative and it."""
    at: dict[tuple[int, str, str], int] = {}
    count: Counter = Counter()
    for p, rid, kind in seq:
        at[(p, rid, kind)] = count[p]
        count[p] += 1
    return {(p, rid): i - at[(p, rid, "fake_negative")] for (p, rid, kind), i in at.items() if kind == "positive"}


def event_time_order(r: JoinRules, imps: dict, acts: dict) -> list[tuple[int, str, str]]:
    """The examples of a join fed each partition's two topics merged by event time (each topic in its own order,
    keyed by its running maximum of ts; an impression before an action of the same key)."""
    out = []
    for p in imps:
        def keyed(records, rank, ts_of):
            top = None
            for i, rec in enumerate(records):
                top = ts_of(rec) if top is None else max(top, ts_of(rec))
                yield (top, rank, i, rec)

        m = JoinState(r)
        for _, rank, _, rec in heapq.merge(keyed(imps[p], 0, lambda x: x[1]), keyed(acts[p], 1, lambda a: a.ts)):
            exs = m.impression(rec[0], rec[1], rec[2]) if rank == 0 else m.action(rec)
            out += [(p, ex.request_id, ex.kind) for ex in exs]
    return out


def written_order(out: list) -> list[tuple[int, str, str]]:
    seq = []
    for _key, _value, headers in out:
        p, rid, kind, _task = dict(headers)[ID_HEADER].decode().split("|")
        seq.append((int(p), rid, kind))
    return seq


def fetch_order(r: JoinRules, imps: dict, acts: dict) -> Counter:
    """The examples of a join fed each partition's impressions, then its actions (no merge), as ``kinds``
    counts them."""
    got: Counter = Counter()
    for p in imps:
        m = JoinState(r)
        exs = [ex for rec in imps[p] for ex in m.impression(rec[0], rec[1], rec[2])]
        exs += [ex for a in acts[p] for ex in m.action(a)]
        got.update((ex.request_id, ex.kind, (("click", ex.event["label"]),)) for ex in exs)
    return got


def join_backlog(tmp_path, wait_ms: float, first_topic: str, expect=oracle):
    cfg = config(tmp_path, wait_ms)
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(3, P, n=3000)
    want = sum((oracle(r, imps[p], acts[p]) for p in range(P)), Counter())
    expected = want if expect is oracle else expect(r, imps, acts)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    first = cfg.join.impressions_topic if first_topic == "impressions" else cfg.join.actions_topic
    out = asyncio.run(join_all(cfg, schema, logs_of(cfg, imps, acts), first, sum(expected.values())))
    written = distances(written_order(out))
    late = {k: written[k] - ref for k, ref in distances(event_time_order(r, imps, acts)).items() if k in written}
    return kinds(out), want, late


@pytest.mark.parametrize("first_topic", ["impressions", "actions"])
def test_positives_follow_their_fake_negatives_in_event_time_order_whatever_the_fetch_order(tmp_path, first_topic):
    got, want, late = join_backlog(tmp_path, 500.0, first_topic)
    assert got == want  # the oracle's examples, each once
    assert len(late) > 500
    assert max(late.values()) <= SLACK, sorted(late.values())[-5:]


def test_without_the_merge_the_worst_fetch_order_loses_positives(tmp_path):
    got, want, _late = join_backlog(tmp_path, 0.0, "impressions", expect=fetch_order)
    positives = lambda c: sum(n for (_rid, kind, _labels), n in c.items() if kind == "positive")  # noqa: E731
    assert positives(got) < positives(want) // 2, (positives(got), positives(want))


def test_a_topic_holds_the_other_by_its_deliveries_or_by_what_the_reader_knows_of_it():
    """A topic that delivered within the wait holds the other; one that delivered nothing since the merge
    started holds only while the reader knows of records of it not fetched (or has no answer about it),
    and for at most ten waits, so a worker restarted on caught-up actions joins its impressions at once."""
    from streamrec.joiner.input_merge import InputMerge

    now = [100.0]
    m = InputMerge("i", "a", {}, 0.5, clock=lambda: now[0])
    m.add("i", [(1, "impression")])
    assert not m.holds("a", behind=False)  # the reader answered: nothing of it to fetch
    assert m.release(10, lambda t: m.holds(t, behind=False)) == [("i", "impression")]
    assert m.holds("a", behind=True)  # records of it not fetched yet, or no answer yet
    now[0] += 5.0
    assert not m.holds("a", behind=True)  # ten waits since the start
    m.add("a", [(2, "action")])
    assert m.holds("a", behind=False)  # it delivered within the wait: it is streaming
    now[0] += 0.6
    assert not m.holds("a", behind=False)
    assert m.holds("a", behind=True)
    m.clear({})
    assert not m.holds("a", behind=False)  # a new start: its deliveries before do not count
