"""Commit-on-checkpoint: the sketch worker commits its snapshots' offsets to its consumer group.

The integration test runs ``streamrec sketch`` as a subprocess against the session's real broker and
reads the group the way lag monitors do (confluent-kafka: the group's committed offsets, the topic's
end offsets) next to the worker's own lag metric (its ``/metrics``) and its snapshots (the state
table's changelog). The unit tests pin the retry rules of :class:`CheckpointCommits`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time

import pytest

from streamrec.ingest import free_port
from streamrec.sketch.app import changelog_topic
from streamrec.sketch.commits import CheckpointCommits
from tests.helpers.sketch import end_offsets, group_committed_offsets, scrape_lag, snapshot_offsets
from tests.sketch.test_sketch_worker import produce, start_worker, stop, write_config


# -- the retry rules (no broker: a commit function that fails on demand) ----------------------------------------

class FlakyCommit:
    """A commit function that fails while ``failing`` is set and records what it committed."""

    def __init__(self):
        self.failing = False
        self.hang = False
        self.calls: list[dict[int, int]] = []
        self.committed: dict[int, int] = {}

    async def __call__(self, offsets: dict[int, int]) -> None:
        self.calls.append(dict(offsets))
        if self.hang:
            await asyncio.sleep(3600)
        if self.failing:
            raise ConnectionError("broker unreachable")
        self.committed.update(offsets)


def test_a_failed_commit_is_one_warning_and_retried_at_the_next_snapshot(caplog):
    async def scenario():
        fn = FlakyCommit()
        commits = CheckpointCommits("events", fn, timeout_s=0.2)
        commits.offer(0, 10)
        await commits.idle()
        assert fn.committed == {0: 10} and commits.pending == {}

        fn.failing = True
        commits.offer(1, 5)
        await commits.idle()
        commits.offer(0, 20)  # the next snapshot: the failed offsets go again, with the new ones
        await commits.idle()
        assert fn.calls[-1] == {0: 20, 1: 5}
        assert commits.pending == {0: 20, 1: 5} and fn.committed == {0: 10}
        fn.failing, fn.hang = False, True  # no answer: bounded by the timeout, a failure like any other
        commits.offer(2, 7)
        await commits.idle()
        assert commits.pending == {0: 20, 1: 5, 2: 7} and commits.failures == 3

        fn.hang = False
        commits.forget([2])  # revoked: its new owner commits it
        commits.offer(0, 30)
        await commits.idle()
        assert fn.committed == {0: 30, 1: 5} and commits.pending == {} and commits.failures == 0
        assert commits.committed == {0: 30, 1: 5}
        await commits.close()

    with caplog.at_level(logging.INFO, logger="streamrec.sketch.commits"):
        asyncio.run(scenario())
    # this module's records only: a Kafka client another test left in this worker may log its own warnings
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "streamrec.sketch.commits"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # three failures in a row, one line
    assert "broker unreachable" in warnings[0].getMessage() and warnings[0].exc_info is None
    assert any("works again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_offers_during_a_running_commit_are_committed_when_it_ends():
    async def scenario():
        gate = asyncio.Event()
        calls: list[dict[int, int]] = []

        async def slow(offsets):
            calls.append(dict(offsets))
            await gate.wait()

        commits = CheckpointCommits("events", slow, timeout_s=5)
        commits.offer(0, 1)
        await asyncio.sleep(0)
        commits.offer(0, 2)
        commits.offer(1, 3)
        gate.set()
        await commits.idle()
        return calls, commits

    calls, commits = asyncio.run(scenario())
    assert calls == [{0: 1}, {0: 2, 1: 3}]
    assert commits.pending == {} and commits.committed == {0: 2, 1: 3}


# -- against the real broker, the real worker process -------------------------------------------------------------

def _wait(what: str, check, timeout: float, log_path, proc=None, every: float = 0.5, show=None):
    """Poll ``check()`` (returns a truthy value when done) until ``timeout``; fail naming ``what`` (and what
    ``show()`` returns then)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        if proc is not None:
            assert proc.poll() is None, f"the worker died; log:\n{log_path.read_text()[-3000:]}"
        try:
            last = check()
        except Exception as e:  # the worker's endpoint not up yet, a topic not there yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            seen = show() if show is not None else last
            pytest.fail(f"timed out waiting for {what} ({seen!r}); worker log:\n{log_path.read_text()[-3000:]}")
        time.sleep(every)


@pytest.mark.broker
@pytest.mark.subprocess
def test_the_group_commits_the_snapshot_offsets_and_its_lag_matches_the_worker(topics, bootstrap, tmp_path):
    cfg = topics
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.metrics_port = free_port("127.0.0.1")
    cfg.generator.events_per_s = 100_000.0
    config = write_config(cfg, tmp_path / "sketch.toml")
    log = tmp_path / "worker.log"
    topic, group, n = cfg.kafka.events_topic, cfg.kafka.sketch_group, cfg.kafka.partitions
    changelog = changelog_topic(cfg.kafka.sketch_group)

    produce(cfg, bootstrap, 0, 20_000)
    ends = end_offsets(bootstrap, topic, n)
    assert all(e > 0 for e in ends.values()), ends  # every partition has records: each one's commit is checked
    assert set(group_committed_offsets(bootstrap, group, topic, n).values()) == {None}

    def caught_up(port):
        """The worker counted everything (its lag metric) and snapshotted everything (the changelog)."""
        lag = scrape_lag(port)
        snaps = snapshot_offsets(bootstrap, changelog)
        return len(lag) == n and sum(lag.values()) == 0 and snaps == end_offsets(bootstrap, topic, n)

    def settled(port, deadline_s: float = 10.0) -> dict[int, int]:
        """Once caught up: the group's commits reach the snapshots' offsets (a commit follows its snapshot by one
        round trip) -- and then they are exactly those offsets and the two lags agree at zero."""
        _wait("the worker to count and snapshot every record", lambda: caught_up(port), 60, log, proc,
              show=lambda: dict(lag=scrape_lag(port), snapshots=snapshot_offsets(bootstrap, changelog),
                                ends=end_offsets(bootstrap, topic, n)))
        snaps = snapshot_offsets(bootstrap, changelog)
        _wait("the group's committed offsets to equal the snapshots' offsets",
              lambda: group_committed_offsets(bootstrap, group, topic, n) == snaps, deadline_s, log, proc, every=0.2,
              show=lambda: dict(committed=group_committed_offsets(bootstrap, group, topic, n), snapshots=snaps))
        # one moment, read three ways: the worker's metric, the group's commits, the topic's ends
        lag_metric = scrape_lag(port)
        committed = group_committed_offsets(bootstrap, group, topic, n)
        ends = end_offsets(bootstrap, topic, n)
        assert committed == snapshot_offsets(bootstrap, changelog) == ends
        group_lag = sum(ends[p] - committed[p] for p in range(n))
        assert group_lag == sum(lag_metric.values()) == 0, (ends, committed, lag_metric)
        return committed

    proc = start_worker(config, bootstrap, log)
    try:
        committed = settled(cfg.sketch.metrics_port)

        # a dead worker: the group keeps its last commits, so a lag monitor sees the records it has not counted
        proc.kill()
        proc.wait(10)
        before = end_offsets(bootstrap, topic, n)
        produce(cfg, bootstrap, 100, 5_000)
        after = end_offsets(bootstrap, topic, n)
        produced = sum(after.values()) - sum(before.values())
        assert produced > 0
        assert group_committed_offsets(bootstrap, group, topic, n) == committed
        assert sum(after[p] - committed[p] for p in range(n)) == produced

        # the restarted worker resumes from its snapshots, which the commits mirror exactly
        mark = len(log.read_text())
        proc = start_worker(config, bootstrap, log)

        def resumed() -> dict[int, int]:
            found = re.findall(r"partition (\d+): resumed \d+ events from the snapshot \(next offset (\d+)\)",
                               log.read_text()[mark:])
            return {int(p): int(o) for p, o in found}

        _wait("every partition to resume from its snapshot", lambda: len(resumed()) == n, 60, log, proc)
        assert resumed() == committed
        settled(cfg.sketch.metrics_port)
    finally:
        stop(proc, signal.SIGTERM)  # SIGKILL after 15 s; the waits above keep the test under the suite's timeout
