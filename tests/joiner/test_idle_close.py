"""The idle timeout (``join.idle_close_s``): a partition that received nothing for that long while it holds open
windows or waiting actions has its event time moved on by the wall time passed, closing its windows and
expiring its orphans; through the join task the move commits as a batch of its own, so a restart from the
committed state finds the windows closed and writes nothing again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from streamrec.foundation import EventSchema
from streamrec.foundation.config import InvalidValue
from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner.join_config import JoinConfig
from streamrec.joiner.join_task import JoinTask
from streamrec.joiner.records import Joiner
from tests.joiner.join_task_fakes import EVENTS, FakeClients, FakeReader, FakeTable, kinds, logs_of
from tests.joiner.test_join_oracle import H, make_streams, oracle, rules
from tests.joiner.test_join_order import config


def all_closed(r: JoinRules, imps: list, acts: list) -> Counter:
    """The oracle's examples once event time moved past every window (an ignored action far ahead closes them)."""
    return oracle(r, imps, acts + [Action("zz-end", 10**12, "no-task")])


def test_config_idle_close_s():
    assert JoinConfig().idle_close_s == 0.0
    with pytest.raises(InvalidValue, match="idle_close_s"):
        JoinConfig(idle_close_s=-1.0)


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
def test_advance_closes_windows_and_expires_orphans(mode):
    store: dict = {}
    m = JoinState(rules(mode, False), store)
    m.impression("r1", 1000, {"ts": 1000, "request_id": "r1"})
    m.action(Action("r1", 1010, "click"))
    m.impression("r2", 1005, {"ts": 1005, "request_id": "r2"})
    m.action(Action("orphan", 1020, "click"))
    assert m.holds_open()
    assert m.advance(10) == [] and m.holds_open()  # not due yet: nothing closes
    out = m.advance(H)
    assert m.wi == 1005 + 10 + H and m.wa == 1020 + 10 + H and store["wm"] == {"i": m.wi, "a": m.wa}
    got = sorted((ex.request_id, ex.kind, ex.event["label"]) for ex in out)
    assert got == ([("r2", "negative", 0)] if mode == "window" else [])  # r1 was written as its click came
    assert not m.holds_open() and m.stats.orphan_actions == 1
    assert m.advance(1000) == [] and not m.holds_open()


def test_advance_without_watermarks_does_nothing_and_one_unset_starts_from_the_other():
    m = JoinState(rules("window", False))
    assert m.advance(500) == [] and m.wi is None and m.wa is None
    m.action(Action("lonely", 2000, "click"))
    assert m.holds_open() and m.advance(30) == []
    assert (m.wi, m.wa) == (2030, 2030) and m.holds_open()  # its orphan wait is not over yet
    m.advance(100)
    assert not m.holds_open() and m.stats.orphan_actions == 1


async def _run_until(task: JoinTask, clients: FakeClients, want: int, timeout_s: float,
                     linger_s: float = 0.0) -> float:
    """Run the join task until ``want`` examples are out (or ``timeout_s`` passed), then ``linger_s`` more; the
    seconds it took to reach ``want``."""
    runner = asyncio.create_task(task.run())
    start = time.monotonic()
    try:
        while len(clients.out.get(EVENTS, [])) < want and time.monotonic() - start < timeout_s:
            assert not runner.done(), runner.exception()
            await asyncio.sleep(0.01)
        took = time.monotonic() - start
        await asyncio.sleep(linger_s)
        assert not runner.done(), runner.exception()
        return took
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
def test_the_join_task_closes_an_idle_partitions_windows_once_and_commits_the_close(tmp_path, mode):
    cfg = config(tmp_path, 100.0)
    cfg.join.mode = mode
    cfg.join.idle_close_s = 0.3
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(5, 2, n=300)
    last = {p: max(a.ts for a in acts[p]) for p in acts}
    acts = {p: [a for a in acts[p] if a.ts < last[p] - 300] for p in acts}  # the actions stop before the end
    want = sum((all_closed(r, imps[p], acts[p]) for p in imps), Counter())
    without = sum(sum(oracle(r, imps[p], acts[p]).values()) for p in imps)
    logs = logs_of(cfg, imps, acts)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    table = FakeTable()
    clients = FakeClients(FakeReader(logs, cfg.join.impressions_topic))

    async def first_run() -> float:
        task = JoinTask(table, Joiner(cfg.join, schema), clients, cfg.kafka, cfg.join)
        await task.assigned({0, 1})
        # then more idle time (several idle periods): nothing further is written
        return await _run_until(task, clients, sum(want.values()), 30.0, linger_s=3 * cfg.join.idle_close_s)

    took = asyncio.run(first_run())
    out = clients.out[EVENTS]
    if mode == "window":
        assert sum(want.values()) >= without + 8  # windows only the idle timeout closes
    assert kinds(out) == want and max(kinds(out).values()) == 1  # each example once
    assert took < cfg.join.idle_close_s + 5.0

    async def restart() -> None:  # the committed state holds the closes: a restart writes nothing again
        task = JoinTask(table, Joiner(cfg.join, schema), clients, cfg.kafka, cfg.join)
        await task.assigned({0, 1})
        assert not any(task.joiner.machines[p].holds_open() for p in (0, 1))
        await _run_until(task, clients, len(out) + 1, 3 * cfg.join.idle_close_s)

    n = len(out)
    asyncio.run(restart())
    assert len(clients.out[EVENTS]) == n


def test_idle_close_is_off_by_default(tmp_path):
    cfg = config(tmp_path, 100.0)
    cfg.join.mode = "window"
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(5, 1, n=200)
    acts = {0: acts[0][: len(acts[0]) // 2]}
    without = sum(oracle(r, imps[0], acts[0]).values())
    assert sum(all_closed(r, imps[0], acts[0]).values()) > without
    clients = FakeClients(FakeReader(logs_of(cfg, imps, acts), cfg.join.impressions_topic))

    async def go() -> None:
        task = JoinTask(FakeTable(), Joiner(cfg.join, EventSchema.from_sections(cfg.model, cfg.ingest)), clients,
                        cfg.kafka, cfg.join)
        await task.assigned({0})
        await _run_until(task, clients, without + 1, 0.5)

    asyncio.run(go())
    assert len(clients.out[EVENTS]) == without


@pytest.mark.broker
@pytest.mark.subprocess
def test_worker_closes_a_stopped_partitions_windows_by_the_idle_timeout(topics, bootstrap, tmp_path):
    """`streamrec join` against the real broker: each partition's actions stop early and then both its topics
    stop; the windows the records left open are closed by the idle timeout within ``idle_close_s`` and a few
    seconds of the record-driven examples, each example written once (and nothing more while it stays idle)."""
    import subprocess

    from streamrec.ingest import TopicSpec, ensure_topics
    from tests.helpers.waiting import wait_until
    from tests.joiner.test_join_worker import P, STREAMREC, examples, join_config, produce
    from tests.sketch.test_sketch_worker import stop, write_config

    cfg = join_config(topics, "window")
    cfg.join.idle_close_s = 2.0
    cfg.join.state_dir = str(tmp_path / "join")
    ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, P), TopicSpec(cfg.join.actions_topic, P)])
    r = JoinRules.from_config(cfg.join)
    imps, acts = make_streams(9, P, n=300)
    last = {p: max(a.ts for a in acts[p]) for p in acts}
    acts = {p: [a for a in acts[p] if a.ts < last[p] - 300] for p in acts}  # the actions stop before the end
    want = sum((all_closed(r, imps[p], acts[p]) for p in imps), Counter())
    without = sum(sum(oracle(r, imps[p], acts[p]).values()) for p in imps)
    assert sum(want.values()) >= without + 8  # windows only the idle timeout closes
    produce(bootstrap, cfg, imps, acts)
    log = tmp_path / "join.log"
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(write_config(cfg, tmp_path / "j.toml")),
                             "--bootstrap", bootstrap], stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        count = lambda: sum(examples(bootstrap, cfg, r).values())  # noqa: E731
        wait_until(lambda: count() >= without or proc.poll() is not None, 120, "the record-driven examples",
                   interval=0.5)
        started = time.monotonic()
        wait_until(lambda: count() >= sum(want.values()) or proc.poll() is not None,
                   cfg.join.idle_close_s + 8.0, "the idle timeout's examples", interval=0.5)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() - started <= cfg.join.idle_close_s + 8.0
        time.sleep(2 * cfg.join.idle_close_s)  # idle on: nothing more is written
        got = examples(bootstrap, cfg, r)
        assert got == want and max(got.values()) == 1
    finally:
        stop(proc)
