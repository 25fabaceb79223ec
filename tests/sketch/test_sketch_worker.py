"""The sketch worker as a process: real embedded broker, `streamrec sketch` as a subprocess (faust +
RocksDB), its hot sets read back with HotSetFollower.

A skewed stream plus malformed records: the published hot set holds the truly hottest ids. After a
SIGKILL and a restart the counts resume exactly (nothing reset, nothing counted twice), and every
partition's restored counts are in the first hot set published, also those with no new records.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrec.ingest import EventProducer, EventSchema, SyntheticStream
from streamrec.sketch import HotSetFollower, latest_hotset
from streamrec.sketch.app import changelog_topic
from tests.conftest import small_config, with_fresh_topics
from tests.helpers.scenarios import Scenarios, selected_scenarios
from tests.helpers.sketch import end_offsets, snapshot_offsets
from tests.helpers.waiting import wait_until

# the module's worker scenarios run side by side on one xdist worker (tests/helpers/scenarios.py)
pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group("sketch-worker"),
              pytest.mark.timeout(600)]

STREAMREC = str(Path(sys.executable).with_name("streamrec"))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_config(cfg, path: Path) -> Path:
    lines = []
    for section, values in cfg.to_dict().items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_worker(config: Path, bootstrap: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen([STREAMREC, "sketch", "--config", str(config), "--bootstrap", bootstrap],
                            stdout=f, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, wait: float = 15.0) -> bool:
    """Send ``sig``; escalate to SIGKILL after ``wait`` s. True when it exited on ``sig`` alone."""
    if proc.poll() is not None:
        return True
    proc.send_signal(sig)
    try:
        proc.wait(wait)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


def produce(cfg, bootstrap, start_chunk: int, n: int, bad: list[bytes] = ()) -> collections.Counter:
    """Send ``n`` synthetic events from chunk ``start_chunk`` on; returns the true (field, id) counts."""
    stream = SyntheticStream(cfg)
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    truth: collections.Counter = collections.Counter()
    done, i = 0, start_chunk
    while done < n:
        b, _ = stream._chunk(i, min(stream.chunk, n - done))
        p.send_batch(b)
        for f, j in b.sparse.items():
            truth.update((f, x) for x in j.values.tolist())
        done += len(b)
        i += 1
    for v in bad:
        p.send_raw(v)
    p.close()
    return truth


def _wait_snapshots_at_end(cfg, bootstrap, timeout: float = 60.0) -> None:
    """Until every partition's newest snapshot in the worker's changelog holds the end of the events topic."""
    ends = end_offsets(bootstrap, cfg.kafka.events_topic, cfg.kafka.partitions)
    wait_until(lambda: snapshot_offsets(bootstrap, changelog_topic(cfg.kafka.sketch_group)) == ends, timeout,
               f"every partition's sketch snapshot at the end of {cfg.kafka.events_topic} ({ends})", interval=0.5)


def _worker_publishes_hottest_ids_and_resumes_after_kill(topics, bootstrap, tmp_path):
    cfg = topics
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7  # stationary stream: decay would only blur the comparison with raw counts
    cfg.sketch.top_k = 1000
    cfg.hot.budget_rows = 200
    cfg.generator.events_per_s = 100_000.0
    config = write_config(cfg, tmp_path / "sketch.toml")
    log = tmp_path / "worker.log"
    n1, n2 = 30_000, 20_000
    bad = [b"not an event", b'{"ts": 1, "label": 9}', b"\xff\xff\xff\xffbroken"]
    truth = produce(cfg, bootstrap, 0, n1, bad)

    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(config, bootstrap, log)
    try:
        hs1 = follower.wait_for(1, timeout=90, predicate=lambda h: h.events == n1)
        assert hs1 is not None, f"no hot set covering {n1} events; worker log:\n{log.read_text()[-3000:]}"
        assert proc.poll() is None, "worker died"
        text = log.read_text()
        assert text.count("skipping malformed record") == len(bad)
        assert f"{len(bad)} malformed records skipped" in text
        # the hot set holds the truly hottest ids
        assert hs1.rows == cfg.hot.budget_rows
        hot = {(f, int(x)) for f, ids in hs1.tables.items() for x in ids}
        true_top = [k for k, _ in truth.most_common(cfg.hot.budget_rows)]
        assert set(true_top[:50]) <= hot
        assert len(hot & set(true_top)) >= 0.95 * len(true_top)
        assert 0 < hs1.coverage <= hs1.hit_rate <= 1
        assert hs1.window_start_ms < hs1.window_end_ms

        # every partition's snapshot in the table, then kill -9, produce more, restart
        _wait_snapshots_at_end(cfg, bootstrap)
        proc.kill()
        proc.wait(10)
        produce(cfg, bootstrap, 100, n2)
        proc = start_worker(config, bootstrap, log)
        # a new version if the rows changed, else the same version with the new counts (never a new version of
        # the same rows: a trainer would migrate them again)
        hs2 = follower.wait_for(hs1.version, timeout=90, predicate=lambda h: h.events >= n1 + n2)
        assert hs2 is not None, f"no hot set after restart; worker log:\n{log.read_text()[-3000:]}"
        # every partition resumed from its RocksDB snapshot (none was re-read from offset 0)
        assert log.read_text().count("resumed") == cfg.kafka.partitions
        # once every partition is counted to its end, any double counting shows in a set published within
        # the next two publish intervals (a set whose counts changed is due at the next one)
        _wait_snapshots_at_end(cfg, bootstrap)
        time.sleep(2 * cfg.sketch.publish_interval_s)
        hs3 = follower.latest()
        assert hs3.version >= hs2.version >= hs1.version  # versions never go backwards across restarts
        assert hs2.version == hs1.version + (not hs2.same_rows(hs1))
        assert hs3.events == n1 + n2, "counts reset or double counted after the restart"
    finally:
        exited_cleanly = stop(proc, signal.SIGTERM)
        follower.close()
    assert exited_cleanly, "worker ignored SIGTERM for 15 s"
    assert proc.returncode is not None


def _a_restarted_worker_publishes_every_partitions_restored_counts(topics, bootstrap, tmp_path):
    """A restarted worker restores every partition's snapshot at once, not when the partition's next record
    arrives: its first hot set counts the events of all partitions, also those with no new records."""
    import signal

    from streamrec.ingest import encode_json, make_producer
    from streamrec.sketch import HotSetFollower

    cfg = topics
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7
    cfg.generator.events_per_s = 100_000.0
    config = write_config(cfg, tmp_path / "sketch.toml")
    log = tmp_path / "worker.log"
    n1 = 8_000
    produce(cfg, bootstrap, 0, n1)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(config, bootstrap, log)
    try:
        hs1 = follower.wait_for(1, timeout=60, predicate=lambda h: h.events == n1)
        latest = follower.latest()
        assert hs1 is not None, (f"no hot set covering {n1} events (latest: {latest and latest.events} events); "
                                 f"worker log:\n{log.read_text()[-3000:]}")
        _wait_snapshots_at_end(cfg, bootstrap)  # every partition's snapshot is in the table
        proc.kill()
        proc.wait(10)
        before = latest_hotset(bootstrap, cfg.kafka.hotset_topic).version  # the last set the killed worker published
        # after the restart only partition 0 gets new records
        p = make_producer(bootstrap)
        for i in range(5):
            p.send(cfg.kafka.events_topic, encode_json({"ts": 1_700_000_000_000 + i, "label": 1, "dense": [0, 0, 0],
                                                        "sparse": {"user": 1, "item": 1, "tags": [1]}}), partition=0)
        p.flush()
        p.close()
        restarted_ms = int(time.time() * 1000)
        proc = start_worker(config, bootstrap, log)
        hs2 = follower.wait_for(before, timeout=60, predicate=lambda h: h.created_ms >= restarted_ms)
        assert hs2 is not None, f"no hot set after the restart; worker log:\n{log.read_text()[-3000:]}"
        assert hs2.events >= n1, f"hot set v{hs2.version} after the restart counts {hs2.events} events, not {n1}+"
        hs3 = follower.wait_for(1, timeout=30, predicate=lambda h: h.events == n1 + 5)
        assert hs3 is not None, f"latest {follower.latest().events} events; log:\n{log.read_text()[-3000:]}"
        assert log.read_text().count("resumed") == cfg.kafka.partitions
    finally:
        exited = stop(proc, signal.SIGTERM)
        follower.close()
    assert exited, "worker ignored SIGTERM"


def _a_record_that_kills_the_worker_is_skipped_by_the_next_start(topics, bootstrap, tmp_path):
    """A record that segfaults the worker while it is counted (a sitecustomize hook stands in for a
    native decoder bug) is skipped by the restarted worker instead of killing it again."""
    import json

    from tests.helpers.crash import CRASH_MARK, install_crash_hook

    cfg = topics
    cfg.kafka.codec = "json"
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.generator.events_per_s = 100_000.0
    config = write_config(cfg, tmp_path / "sketch.toml")
    log = tmp_path / "worker.log"
    n = 3000
    poison = json.dumps({"ts": 1, "label": 1, "dense": [0.0] * cfg.model.dense_dim, "request_id": CRASH_MARK})
    produce(cfg, bootstrap, 0, n, [poison.encode()])
    env = install_crash_hook(tmp_path / "hook")
    proc = start_worker(config, bootstrap, log, env)
    try:
        assert proc.wait(120) == -signal.SIGSEGV, log.read_text()[-3000:]
    finally:
        stop(proc, signal.SIGKILL)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(config, bootstrap, log, env)
    try:
        hs = follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n)
        assert hs is not None, f"no hot set covering {n} events; worker log:\n{log.read_text()[-3000:]}"
        assert proc.poll() is None, "the restarted worker died again"
        assert "skipping the record that killed the previous worker process" in log.read_text()
    finally:
        stop(proc, signal.SIGTERM)
        follower.close()


def _two_workers_publish_the_global_hot_set(topics, bootstrap, tmp_path):
    """Two workers of one app split the partitions; the one holding partition 0 publishes the hot set of all
    of them (its own partitions live, the other's from the table's changelog): its top ids match what one
    worker reading everything chooses (recall >= 0.99), and it counts every event."""
    from streamrec.ingest import read_topic
    from tests.helpers.sketch import sketch_state

    cfg = topics
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7
    cfg.sketch.top_k = 1000
    cfg.hot.budget_rows = 200
    cfg.generator.events_per_s = 100_000.0
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    configs = []
    for name in ("a", "b"):  # one app (group), each worker its own state dir
        cfg.sketch.state_dir = str(tmp_path / f"state-{name}")
        configs.append(write_config(cfg, tmp_path / f"sketch-{name}.toml"))
    n = 30_000
    produce(cfg, bootstrap, 0, n)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    procs = [start_worker(c, bootstrap, log) for c, log in zip(configs, logs)]
    try:
        deadline = time.monotonic() + 150
        while "from other workers' snapshots" not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline, "".join(log.read_text()[-3000:] for log in logs)
            assert all(p.poll() is None for p in procs), "a worker died"
            time.sleep(0.5)
        # a set published once the group has split the partitions (the first worker alone may have owned all of
        # them): the version of the first one published from the split, or a later one, counting every event
        import re

        split_version = int(re.search(r"published hot set v(\d+):[^\n]*from other workers' snapshots",
                                      "".join(log.read_text() for log in logs)).group(1))
        hs = follower.wait_for(split_version, timeout=60, predicate=lambda h: h.events == n)
        text = "".join(log.read_text() for log in logs)
        assert hs is not None, f"no hot set covering all {n} events; logs:\n{text[-4000:]}"
        assert all(p.poll() is None for p in procs), "a worker died"
        assert text.count("published hot set") >= 1
        # one worker reading everything: the same records through the same state
        single = sketch_state(cfg)
        for r in read_topic(bootstrap, cfg.kafka.events_topic, expected=None, timeout=10):
            single.apply(r.partition, r.offset, r.value)
        want = single.choose(1)
        keys = lambda h: {(t, int(x)) for t, ids in h.tables.items() for x in ids}  # noqa: E731
        recall = len(keys(hs) & keys(want)) / len(keys(want))
        assert recall >= 0.99, recall
    finally:
        for p in procs:
            stop(p, signal.SIGTERM)
        follower.close()


SCENARIOS = {
    "worker_publishes_hottest_ids_and_resumes_after_kill": _worker_publishes_hottest_ids_and_resumes_after_kill,
    "a_restarted_worker_publishes_every_partitions_restored_counts":
        _a_restarted_worker_publishes_every_partitions_restored_counts,
    "a_record_that_kills_the_worker_is_skipped_by_the_next_start":
        _a_record_that_kills_the_worker_is_skipped_by_the_next_start,
    "two_workers_publish_the_global_hot_set": _two_workers_publish_the_global_hot_set,
}


@pytest.fixture(scope="module")
def worker_runs(bootstrap, tmp_path_factory, request):
    """The scenarios of the module's selected tests, started at once, each on topics and a directory of its own;
    a test waits for its own."""
    names = selected_scenarios(request, lambda item: item.originalname.removeprefix("test_"))
    with Scenarios() as runs:
        for name in sorted(names & SCENARIOS.keys()):
            root = tmp_path_factory.mktemp(name[:40])
            runs.start(name, SCENARIOS[name], with_fresh_topics(small_config(root), bootstrap), bootstrap, root)
        yield runs


def test_worker_publishes_hottest_ids_and_resumes_after_kill(worker_runs):
    worker_runs.result("worker_publishes_hottest_ids_and_resumes_after_kill")


def test_a_restarted_worker_publishes_every_partitions_restored_counts(worker_runs):
    worker_runs.result("a_restarted_worker_publishes_every_partitions_restored_counts")


def test_a_record_that_kills_the_worker_is_skipped_by_the_next_start(worker_runs):
    worker_runs.result("a_record_that_kills_the_worker_is_skipped_by_the_next_start")


def test_two_workers_publish_the_global_hot_set(worker_runs):
    worker_runs.result("two_workers_publish_the_global_hot_set")
