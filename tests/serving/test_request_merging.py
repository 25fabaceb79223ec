"""RequestMerger: concurrent Predict requests scored together, each getting exactly its
own scores, on its own version, with errors reaching every request of the pass."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from streamrec.ingest import EventBatch, JaggedIds
from streamrec.serving.merge import RequestMerger

FIELDS = ["a", "b"]


class Version:
    def __init__(self, name: str, delay_s: float = 0.0, fail: bool = False):
        self.name, self.delay_s, self.fail = name, delay_s, fail
        self.fields, self.dense_dim = FIELDS, 1
        self.calls: list[int] = []  # events per scoring pass

    def predict(self, batch: EventBatch) -> np.ndarray:
        self.calls.append(len(batch))
        time.sleep(self.delay_s)  # long enough for other requests to queue up meanwhile
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        # a score that identifies the event: its dense value plus the sum of its ids
        return batch.dense[:, 0] + np.add.reduceat(batch.sparse["a"].values, batch.sparse["a"].offsets[:-1])


def batch_of(first: int, n: int) -> EventBatch:
    ids = np.arange(first, first + n, dtype=np.int64) * 1000
    one = JaggedIds(ids, np.arange(n + 1, dtype=np.int64))
    return EventBatch(ts=np.zeros(n, np.int64), labels=np.zeros(n, np.float32),
                      dense=np.arange(first, first + n, dtype=np.float32).reshape(n, 1),
                      sparse={"a": one, "b": one})


def expected(first: int, n: int) -> np.ndarray:
    k = np.arange(first, first + n, dtype=np.float64)
    return k + k * 1000


def merger(max_events: int) -> RequestMerger:
    return RequestMerger(lambda v, b: v.predict(b), lambda v: v.fields, lambda v: v.dense_dim, max_events)


def run_concurrently(m: RequestMerger, jobs: list[tuple[Version, int, int]]) -> list:
    out: list = [None] * len(jobs)

    def one(i, v, first, n):
        try:
            out[i] = m.score(v, batch_of(first, n))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
        time.sleep(0.002)
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a request never finished"
    return out


def test_concurrent_requests_are_merged_and_each_gets_its_own_scores():
    v = Version("v1", delay_s=0.05)
    m = merger(4096)
    jobs = [(v, 100 * i, 1 + i % 5) for i in range(12)]
    out = run_concurrently(m, jobs)
    for (_, first, n), got in zip(jobs, out):
        np.testing.assert_allclose(got, expected(first, n))
    assert sum(v.calls) == sum(n for _, _, n in jobs)
    assert len(v.calls) < len(jobs) and m.merged > 0  # some passes scored several requests


def test_a_lone_request_is_scored_at_once_and_merging_can_be_off():
    v = Version("v1")
    m = merger(4096)
    np.testing.assert_allclose(m.score(v, batch_of(5, 3)), expected(5, 3))
    assert v.calls == [3] and m.rounds == 1
    off = merger(0)
    out = run_concurrently(off, [(Version("x", 0.02), 10 * i, 2) for i in range(4)])
    assert all(len(o) == 2 for o in out) and off.rounds == 0  # 0 = every request scored alone


def test_versions_are_never_mixed_and_the_cap_holds():
    old, new = Version("old", 0.05), Version("new", 0.05)
    m = merger(6)
    jobs = [(old if i % 2 else new, 10 * i, 2) for i in range(10)]
    out = run_concurrently(m, jobs)
    for (_, first, n), got in zip(jobs, out):
        np.testing.assert_allclose(got, expected(first, n))
    assert sum(old.calls) == 10 and sum(new.calls) == 10
    assert max(old.calls + new.calls) <= 6


def test_an_error_reaches_every_request_of_its_pass_and_the_merger_recovers():
    bad = Version("bad", delay_s=0.05, fail=True)
    m = merger(4096)
    out = run_concurrently(m, [(bad, 10 * i, 1) for i in range(6)])
    assert all(isinstance(o, RuntimeError) and "bad failed" in str(o) for o in out)
    good = Version("good")
    np.testing.assert_allclose(m.score(good, batch_of(1, 2)), expected(1, 2))


@pytest.mark.parametrize("n_threads", [32])
def test_many_threads_finish(n_threads):
    v = Version("v", delay_s=0.001)
    m = merger(64)
    jobs = [(v, i * 10, 1 + i % 3) for i in range(n_threads)]
    out = run_concurrently(m, jobs)
    for (_, first, n), got in zip(jobs, out):
        np.testing.assert_allclose(got, expected(first, n))
