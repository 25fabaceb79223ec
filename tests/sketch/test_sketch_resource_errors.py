"""A sketch worker whose state directory (``sketch.state_dir``) fills up or is read-only stops with one
line naming the error, the path and what to do, with no traceback in its log; once the disk is writable
and has space again, a restart loses nothing: its snapshots resume and every event is counted once.

A real `streamrec sketch` process, a real embedded broker and a real small tmpfs (full, then remounted
read-only, then given its space back)."""

from __future__ import annotations

import subprocess
import time
from contextlib import ExitStack

import pytest

from streamrec.sketch import HotSetFollower
from streamrec.sketch.app import changelog_topic
from tests.conftest import small_config, with_fresh_topics
from tests.helpers.disks import fill, tmpfs
from tests.helpers.scenarios import Scenarios, selected_scenarios
from tests.helpers.sketch import (end_offsets, produce_events, snapshot_offsets, start_worker, stop_worker,
                                  write_config)
from tests.helpers.waiting import wait_until

# one worker runs the module: its cases start once, side by side
pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group("sketch-full-disk")]


def _wait_exit(proc, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc.poll()


def _run_log(log) -> str:
    """What the worker process of one run wrote (each run writes its own log file)."""
    return log.read_text(errors="replace")


def _one_line(text: str, needle: str) -> str:
    """The worker's last line, which must be the only one saying ``needle``; no traceback anywhere."""
    assert "Traceback" not in text, text[-5000:]
    # no second error line: not from streamrec, not from a failed callback in faust's store
    assert not [ln for ln in text.splitlines() if " ERROR streamrec" in ln or " ERROR asyncio" in ln], text[-5000:]
    hits = [ln for ln in text.splitlines() if needle in ln]
    assert len(hits) == 1, text[-5000:]
    assert text.strip().splitlines()[-1] == hits[0], text[-3000:]
    return hits[0]


# bytes left free when the disk fills: none (the first write fails: the in-flight marker of a batch), or a
# little (the marker still fits, the state table's RocksDB write of a snapshot does not)
LEAVE = {"every-write-fails": 0, "the-table-write-fails": 8192}


@pytest.fixture(scope="module")
def disk_runs(bootstrap, tmp_path_factory, request):
    """Each selected case on a small tmpfs of its own, the cases side by side (their time is the workers'
    start-ups and exits: tests/helpers/scenarios.py); a test waits for its own."""
    names = selected_scenarios(request, lambda item: item.callspec.params["case"])
    with ExitStack() as stack:
        roots = {name: tmp_path_factory.mktemp(name) for name in names}
        disks = {name: stack.enter_context(tmpfs(root / "disk", "4m")) for name, root in roots.items()}
        runs = stack.enter_context(Scenarios())  # entered last, left first: every case ends before its disk goes
        for name, root in roots.items():
            runs.start(name, _full_then_read_only, with_fresh_topics(small_config(root), bootstrap), bootstrap, root,
                       disks[name], LEAVE[name])
        yield runs


@pytest.mark.parametrize("case", list(LEAVE))
@pytest.mark.timeout(420)
def test_a_full_then_read_only_state_dir_is_one_line_and_nothing_is_lost(disk_runs, case):
    disk_runs.result(case)


def _full_then_read_only(topics, bootstrap, tmp_path, small_disk, leave: int) -> None:
    cfg = topics
    cfg.sketch.state_dir = str(small_disk / "sketch")
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7
    config = write_config(cfg, tmp_path / "sketch.toml")
    n1, n2 = 2000, 1500
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    try:
        # 1. a healthy run: everything so far is in the partition snapshots
        produce_events(cfg, bootstrap, n1, seed=1)
        log1 = tmp_path / "run1.log"
        proc = start_worker(config, bootstrap, log1)
        try:
            assert follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n1), _run_log(log1)[-3000:]
            ends = end_offsets(bootstrap, cfg.kafka.events_topic, cfg.kafka.partitions)
            wait_until(lambda: snapshot_offsets(bootstrap, changelog_topic(cfg.kafka.sketch_group)) == ends, 60,
                       "every partition's snapshot at the topic's end", interval=0.5)

            # 2. the disk fills up under the running worker; new events make it write
            filler = fill(small_disk, leave)
            with pytest.raises(OSError):  # really full: no room for a snapshot
                with open(small_disk / "probe", "wb") as f:
                    f.write(b"\0" * (leave + 8192))
            (small_disk / "probe").unlink(missing_ok=True)
            produce_events(cfg, bootstrap, n2, seed=2)
            assert _wait_exit(proc, 90) == 1, _run_log(log1)[-5000:]
        finally:
            stop_worker(proc)
        line = _one_line(_run_log(log1), "no space left on the device")
        assert line.startswith("streamrec sketch: no space left on the device"), line
        assert f" at {small_disk}" in line and "free space there" in line, line

        # 3. a start on the still-full disk: the same one line, before faust opens its store
        log2 = tmp_path / "run2.log"
        proc = start_worker(config, bootstrap, log2)
        try:
            assert _wait_exit(proc, 90) == 1, _run_log(log2)[-5000:]
        finally:
            stop_worker(proc)
        line = _one_line(_run_log(log2), "no space left on the device")
        assert f"at {small_disk}" in line, line

        # 4. the file system turns read-only (remounted as an operator or the kernel does after errors)
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
        log3 = tmp_path / "run3.log"
        proc = start_worker(config, bootstrap, log3)
        try:
            assert _wait_exit(proc, 90) == 1, _run_log(log3)[-5000:]
        finally:
            stop_worker(proc)
        line = _one_line(_run_log(log3), "read-only")
        assert f" at {small_disk}" in line and "remount it read-write" in line, line

        # 5. writable with space again: the restart resumes from the snapshots and counts every event once
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
        filler.unlink()
        log4 = tmp_path / "run4.log"
        proc = start_worker(config, bootstrap, log4)
        try:
            hs = follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n1 + n2)
            assert hs is not None, _run_log(log4)[-4000:]
            ends = end_offsets(bootstrap, cfg.kafka.events_topic, cfg.kafka.partitions)
            wait_until(lambda: snapshot_offsets(bootstrap, changelog_topic(cfg.kafka.sketch_group)) == ends, 60,
                       "the snapshots resumed, at the topic's end", interval=0.5)
            assert proc.poll() is None
            text = _run_log(log4)
            assert "resumed" in text  # from the snapshots of run 1, not from scratch
        finally:
            assert stop_worker(proc)
        assert "Traceback" not in _run_log(log4)
        assert not follower.wait_for(1, timeout=3, predicate=lambda h: h.events > n1 + n2)  # nothing twice
    finally:
        follower.close()
