"""kill -9 of the joiner at each of its failpoints (mid-batch, before and after the batch's sends, between the
commit's atomic record and its applies, between the changelog's acknowledgement of a batch and its write to the
local RocksDB copy (which the restart keeps), after the commit, between the acknowledgements of one batch's messages),
one after another on the same stream, and of one of two or three workers while the partitions move: the labelled events read back from the events topic equal the undisturbed
join's (the oracle's, which tests/joiner/test_join_worker.py shows the undisturbed worker writes): none lost, none
doubled.

The module's five scenarios share nothing but the broker and spend their time waiting on restarts (a killed
member's consumer group settles before the next run is assigned its partitions), so they run side by side
(tests/helpers/scenarios.py), started once by ``kill_runs``; the window and fake_negative kill matrices read one
prepared backlog (the same two input topics), each with its own group, state and output topic."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest

from streamrec.joiner import JoinRules
from tests.conftest import small_config, with_fresh_topics
from tests.helpers.scenarios import Scenarios, selected_scenarios
from tests.helpers.waiting import wait_until
from tests.joiner.test_join_oracle import oracle
from tests.joiner.test_join_worker import P, STREAMREC, examples, join_config, joined_streams, produce
from tests.sketch.test_sketch_worker import stop, write_config

# one worker runs the module (its scenarios start once, side by side); the limit is above the longest scenario's
# own waits (seven runs of up to 150 s each)
pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group("join-kill"),
              pytest.mark.timeout(1200)]

# one kill at each failpoint of a batch, in the order a batch reaches them; each count lies past the hits a restart's
# recovery makes (P partitions), so every kill falls in a batch of its own run
POINTS = ["join.before_record@*#40", "join.before_send@*#9", "join.after_send@*#12", "join.after_tx@*#10",
          "join.mid_apply@*#11", "join.before_local@*#10", "join.after_commit@*#9"]


def _kill_runs(points, config, bootstrap: str, log) -> list[int]:
    """Start the joiner once per failpoint; each run dies there (its log says so), or is killed after 150 s
    and fails the test: a run killed before its point proves nothing. The return codes of the runs."""
    codes = []
    for point in points:
        proc = subprocess.Popen([STREAMREC, "join", "--config", str(config), "--bootstrap", bootstrap],
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                env=dict(os.environ, STREAMREC_FAILPOINTS=point))
        try:
            proc.wait(150)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        name = point.split("@")[0]
        assert f"failpoint {name} reached" in log.read_text(), f"{point} not reached:\n{log.read_text()[-3000:]}"
        codes.append(proc.returncode)
    return codes


def _final_run(config, bootstrap: str, log, read, want: Counter, settle_s: float = 0.0) -> Counter:
    """One undisturbed run until ``read()`` (the examples on the events topic) holds as many as ``want``;
    waits ``settle_s`` more for a doubled example to show; what ``read()`` returns then."""
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(config), "--bootstrap", bootstrap],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: sum(read().values()) >= sum(want.values()) or proc.poll() is not None,
                   120, "the joiner's examples after the kills", interval=1.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(settle_s)
        return read()
    finally:
        stop(proc)


# every failpoint in window mode (each start is a faust group join: seconds per point); in fake_negative mode,
# whose batches take the same code path, the two where a restart finds a batch half done: its examples in the
# log but not its state, and its state record written but not all applied
MATRICES = {"window-every-point": ("window", POINTS),
            "fake_negative-two-points": ("fake_negative", ["join.mid_apply@*#11", "join.after_send@*#15"])}


def _kill_matrix(cfg, bootstrap, root, r: JoinRules, want: Counter, points: list[str]) -> None:
    """The joiner killed at each of ``points`` in turn, then run to the end: the undisturbed join's examples."""
    cfg.join.state_dir = str(root / "join")
    config = write_config(cfg, root / "j.toml")
    log = root / "join.log"
    codes = _kill_runs(points, config, bootstrap, log)
    assert sum(c == -signal.SIGKILL for c in codes) == len(points)
    mid = examples(bootstrap, cfg, r)
    # the kills fell inside the run (each point's line is in the log: _kill_runs); whether a killed batch's
    # examples are visible on the topic yet depends on timing, so only "work was left" is asserted here, and the
    # final run's exact equality is what proves nothing lost or doubled
    assert sum(mid.values()) < sum(want.values()), "the kills left no work for the last run"
    got = _final_run(config, bootstrap, log, lambda: examples(bootstrap, cfg, r), want)
    assert got == want, (f"lost {sum((want - got).values())}, doubled {sum((got - want).values())}; "
                         f"{sorted(got - want)} log:\n{log.read_text()[-3000:]}")


def _start_kill_matrices(runs: Scenarios, bootstrap: str, tmp_path_factory, names: set[str]) -> None:
    """One backlog (seed 5, 400 impressions) in one pair of input topics; each mode's matrix joins it with its own
    group, state and output topic, against its own mode's oracle."""
    shared, previous = None, None
    for name, (mode, points) in MATRICES.items():
        if name not in names:
            continue
        root = tmp_path_factory.mktemp(name)
        cfg = join_config(with_fresh_topics(small_config(root), bootstrap), mode)
        cfg.join.batch_records = 9
        if shared is None:
            r, imps, acts, want = joined_streams(bootstrap, cfg, 5, n=400)
            produce(bootstrap, cfg, imps, acts)
            shared = (cfg.join.impressions_topic, cfg.join.actions_topic, imps, acts)
        else:
            cfg.join.impressions_topic, cfg.join.actions_topic, imps, acts = shared
            r = JoinRules.from_config(cfg.join)
            want = sum((oracle(r, imps[p], acts[p]) for p in range(P)), Counter())
        # the matrices one after the other: in fake_negative mode a kill must find examples written, and a run
        # slowed by the other matrix's restarts has been seen to reach both points with none written yet
        runs.start(name, _kill_matrix, cfg, bootstrap, root, r, want, points, after=previous)
        previous = name


@pytest.fixture(scope="module")
def kill_runs(bootstrap, tmp_path_factory, request):
    """The scenarios of the module's selected tests, started at once; a test waits for its own."""
    names = selected_scenarios(request, lambda item: item.callspec.params["matrix"] if hasattr(item, "callspec")
                               else item.originalname.removeprefix("test_"))
    with Scenarios() as runs:
        _start_kill_matrices(runs, bootstrap, tmp_path_factory, names)
        for name, scenario in (("kill_during_a_rebalance_with_two_workers", _rebalance_with_two_workers),
                               ("kill_during_a_rebalance_with_three_workers", _rebalance_with_three_workers),
                               ("kill_with_arrow_messages_of_several_examples", _arrow_messages_kills)):
            if name not in names:
                continue
            root = tmp_path_factory.mktemp(name)
            runs.start(name, scenario, with_fresh_topics(small_config(root), bootstrap), bootstrap, root)
        yield runs


@pytest.mark.parametrize("matrix", list(MATRICES))
def test_kill_at_each_failpoint_loses_and_doubles_nothing(kill_runs, matrix):
    kill_runs.result(matrix)


def test_kill_during_a_rebalance_with_two_workers(kill_runs):
    kill_runs.result("kill_during_a_rebalance_with_two_workers")


def _workers(cfg, bootstrap: str, tmp_path, names: str):
    """Worker processes named by the letters of ``names``, each with its own state dir and log: (their
    processes by name, their logs by name, ``start(name, env_extra=None)``, which (re)starts one)."""
    procs: dict[str, subprocess.Popen] = {}
    logs = {w: tmp_path / f"join-{w}.log" for w in names}

    def start(w: str, env_extra: dict | None = None) -> None:
        cfg.join.state_dir = str(tmp_path / f"state-{w}")
        config = write_config(cfg, tmp_path / f"{w}.toml")
        env = dict(os.environ, **(env_extra or {}))
        procs[w] = subprocess.Popen([STREAMREC, "join", "--config", str(config), "--bootstrap", bootstrap],
                                    stdout=open(logs[w], "ab"), stderr=subprocess.STDOUT, env=env)

    return procs, logs, start


RESTORED = "partition {}: join state restored"


def _restored(log, partitions: int) -> set[int]:
    """The partitions a worker's log says it restored (took over) so far."""
    text = log.read_text()
    return {p for p in range(partitions) if RESTORED.format(p) in text}


def _all_examples(bootstrap, cfg, r, want: Counter, procs: dict, what: str, logs: dict) -> None:
    """Wait until the events topic holds as many examples as ``want`` with every worker running, then
    for a doubled one to show: exactly ``want``."""
    wait_until(lambda: sum(examples(bootstrap, cfg, r).values()) >= sum(want.values())
               or any(p.poll() is not None for p in procs.values()), 180, what, interval=1.0)
    assert all(p.poll() is None for p in procs.values()), {w: log.read_text()[-2000:] for w, log in logs.items()}
    time.sleep(2)  # nothing more arrives
    got = examples(bootstrap, cfg, r)
    assert got == want, f"lost {sum((want - got).values())}, doubled {sum((got - want).values())}"


def _rebalance_with_two_workers(topics, bootstrap, tmp_path) -> None:
    """Two workers split the partitions; one is killed in the middle of a batch while the other is running,
    so its partitions move; later it comes back and the partitions move again: the same examples as the
    undisturbed join."""
    cfg = join_config(topics, "fake_negative")
    cfg.join.batch_records = 9
    r, imps, acts, want = joined_streams(bootstrap, cfg, 9, n=400)
    produce(bootstrap, cfg, imps, acts)
    procs, logs, start = _workers(cfg, bootstrap, tmp_path, "ab")
    start("b")
    start("a", {"STREAMREC_FAILPOINTS": "join.after_send@*#12"})
    try:
        procs["a"].wait(90)
        assert procs["a"].returncode == -signal.SIGKILL, logs["a"].read_text()[-3000:]
        mine = _restored(logs["a"], P)
        assert mine, logs["a"].read_text()[-3000:]
        wait_until(lambda: mine <= _restored(logs["b"], P), 60, f"worker b taking over partitions {mine}",
                   interval=0.5)
        start("a")  # and the partitions move again
        _all_examples(bootstrap, cfg, r, want, procs, "the two workers' examples", logs)
    finally:
        for p in procs.values():
            stop(p)


def test_kill_during_a_rebalance_with_three_workers(kill_runs):
    kill_runs.result("kill_during_a_rebalance_with_three_workers")


THREE = 3  # partitions of the three workers' topics: one each once the group settles


def _running_max(tss) -> list[int]:
    out, m = [], None
    for t in tss:
        m = t if m is None else max(m, t)
        out.append(m)
    return out


def produce_paced(bootstrap, cfg, imps: dict, acts: dict, chunks: int, pause_s: float) -> None:
    """``produce`` in ``chunks`` slices of event time, ``pause_s`` apart: each slice holds the records of both
    topics whose running maximum ``ts`` (the key the joiner's merge orders by) falls in it, so each topic
    keeps its order and, the merge waiting longer than a pause (``join.merge_wait_ms``), the join reads them
    in the order it reads the backlog: the same examples."""
    ikeys = {p: _running_max(ts for _, ts, _ in imps[p]) for p in imps}
    akeys = {p: _running_max(a.ts for a in acts[p]) for p in acts}
    every = [k for ks in (*ikeys.values(), *akeys.values()) for k in ks]
    lo, hi = min(every), max(every) + 1
    bounds = [lo + (hi - lo) * i // chunks for i in range(chunks)] + [hi]
    for b0, b1 in zip(bounds, bounds[1:]):
        produce(bootstrap, cfg, {p: [x for x, k in zip(imps[p], ikeys[p]) if b0 <= k < b1] for p in imps},
                {p: [x for x, k in zip(acts[p], akeys[p]) if b0 <= k < b1] for p in acts})
        time.sleep(pause_s)


def _rebalance_with_three_workers(topics, bootstrap, tmp_path) -> None:
    """Worker a joins alone and owns every partition; the stream starts (paced: its last records come
    seconds after the workers' joins) and b and c join, and the rebalance that takes a's partitions kills
    it mid-work (``join.revoked``: the revocation reached it, a batch of its own may be in flight). b and c
    take them over; a comes back and the three split the partitions: the same examples as the undisturbed
    join of the backlog, nothing lost or doubled."""
    cfg = join_config(topics, "fake_negative")
    cfg.kafka.partitions = THREE
    cfg.join.batch_records = 9
    cfg.join.merge_wait_ms = 3000.0  # above produce_paced's pauses
    r, imps, acts, want = joined_streams(bootstrap, cfg, 13, partitions=THREE, n=800)
    procs, logs, start = _workers(cfg, bootstrap, tmp_path, "abc")
    start("a", {"STREAMREC_FAILPOINTS": "join.revoked@*#1"})
    try:
        wait_until(lambda: _restored(logs["a"], THREE) == set(range(THREE)) or procs["a"].poll() is not None, 90,
                   "worker a owning every partition", interval=0.2)
        start("b")
        start("c")
        producing = threading.Thread(target=produce_paced, args=(bootstrap, cfg, imps, acts, 40, 0.3))
        producing.start()
        procs["a"].wait(90)
        assert procs["a"].returncode == -signal.SIGKILL, logs["a"].read_text()[-3000:]
        assert "failpoint join.revoked reached" in logs["a"].read_text()
        mid = sum(examples(bootstrap, cfg, r).values())
        assert 0 < mid < sum(want.values()), f"{mid} of {sum(want.values())} examples when a died: no work moved"
        wait_until(lambda: _restored(logs["b"], THREE) | _restored(logs["c"], THREE) == set(range(THREE)), 60,
                   "b and c taking over every partition", interval=0.5)
        start("a")  # the partitions move again, now among three

        def owners() -> dict[str, set[int]]:
            a_again = logs["a"].read_text().split("failpoint join.revoked reached")[-1]
            return {w: {p for p in range(THREE) if RESTORED.format(p) in text} for w, text in
                    (("a", a_again), ("b", logs["b"].read_text()), ("c", logs["c"].read_text()))}

        wait_until(lambda: all(owners().values()), 90, "the three workers splitting the partitions", interval=0.5)
        producing.join(60)
        _all_examples(bootstrap, cfg, r, want, procs, "the three workers' examples", logs)
    finally:
        for p in procs.values():
            stop(p)


def arrow_examples(bootstrap, cfg) -> Counter:
    """The examples in the events topic written as Arrow messages: each message's rows, their kinds and
    identities from its headers (one identity per row, the request id in it equal to the row's)."""
    import json

    import pyarrow as pa

    from streamrec.joiner import FEEDBACK_HEADER
    from streamrec.joiner.app import IDS_HEADER
    from tests.joiner.test_join_worker import read_all

    got: Counter = Counter()
    for m in read_all(bootstrap, cfg.kafka.events_topic):
        rows = pa.ipc.open_stream(m.value).read_all().to_pylist()
        h = dict(m.headers)
        kinds = h[FEEDBACK_HEADER].decode().split(",")
        ids = json.loads(h[IDS_HEADER])
        assert len(rows) == len(kinds) == len(ids) and len(rows) <= cfg.kafka.events_per_message
        for row, kind, ident in zip(rows, kinds, ids):
            assert ident.split("|")[1] == row["request_id"]
            got[(row["request_id"], kind, (("click", row["label"]),))] += 1
    return got


def test_kill_with_arrow_messages_of_several_examples(kill_runs):
    kill_runs.result("kill_with_arrow_messages_of_several_examples")


def _arrow_messages_kills(topics, bootstrap, tmp_path) -> None:
    """Arrow output, a few examples per message: a kill after some of a batch's messages were acknowledged,
    then one between the commit's record and its applies, leave exactly the undisturbed join's examples, each
    once."""
    cfg = join_config(topics, "fake_negative")
    cfg.kafka.codec = "arrow"
    cfg.kafka.events_per_message = 3
    cfg.join.state_dir = str(tmp_path / "join")
    cfg.join.batch_records = 30
    r, imps, acts, want = joined_streams(bootstrap, cfg, 7, n=400)
    produce(bootstrap, cfg, imps, acts)
    config = write_config(cfg, tmp_path / "j.toml")
    log = tmp_path / "join.log"
    points = ["join.between_acks@*#3", "join.mid_apply@*#4"]
    for code in _kill_runs(points, config, bootstrap, log):
        assert code == -signal.SIGKILL, log.read_text()[-3000:]
    mid = arrow_examples(bootstrap, cfg)
    assert 0 < sum(mid.values()) < sum(want.values()), "the kills left work for the last run"
    got = _final_run(config, bootstrap, log, lambda: arrow_examples(bootstrap, cfg), want, settle_s=2)
    assert got == want, f"lost {sum((want - got).values())}, doubled {sum((got - want).values())}"
