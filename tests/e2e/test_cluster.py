"""The simulated hosts (``streamrec.benchmarks.netns``): network namespaces joined by veth links. Needs root and
iproute2. The harness removes every namespace, link and process it made, also when the test fails; a trainer host
is lost (killed, or its link cut) at three points of a checkpoint cycle. A trainer group across two of these hosts
is run by ``bench cluster --tiny`` (tests/project/test_benches.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrec.benchmarks import netns

pytestmark = [pytest.mark.subprocess, pytest.mark.e2e]

WHY = netns.available()
needs_netns = pytest.mark.skipif(bool(WHY), reason=f"simulated hosts need network namespaces: {WHY}")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@needs_netns
def test_the_harness_removes_every_namespace_link_and_process_even_when_a_test_fails(tmp_path):
    procs = []
    with pytest.raises(RuntimeError, match="the test failed"):
        with netns.SimulatedCluster(2, tmp_path, mbit=50) as c:
            names = [h.ns for h in c.hosts] + [c.switch]
            assert all(n in _namespaces() for n in names)
            procs.append(c.spawn(1, ["sleep", "600"], "sleeper"))
            ping = subprocess.run(["ip", "netns", "exec", c.hosts[0].ns, sys.executable, "-c",
                                   "import socket; s = socket.socket(); s.settimeout(3)\n"
                                   f"try: s.connect(('{c.hosts[1].address}', 9))\n"
                                   "except ConnectionRefusedError: print('reached')"],
                                  capture_output=True, text=True, timeout=30)
            assert ping.stdout.strip() == "reached"  # host 0 reaches host 1 over the link (a reset: no listener)
            c.cut(1)
            raise RuntimeError("the test failed")
    assert procs[0].poll() is not None  # killed with its host
    assert not any(n in _namespaces() for n in names)


LOSSES = (("kill", 0.1), ("cut", 0.5), ("kill", 0.9))  # (how, phase of the checkpoint interval)


def _lose_a_host(root, how: str, phase: float, benches: list) -> dict:
    """One host-loss run on a simulated cluster of its own (its broker, backlog and hosts), closed after it."""
    from streamrec.benchmarks.bench_cluster import ClusterBench

    # the loss waits for serving's first version, which a loaded machine delivers late in training (the snapshot's
    # program is exported first): the backlog outlasts that wait, so the loss falls before the last event
    # the hosts' torchruns start side by side on a loaded machine, seconds apart: a 5 s last call forms the first
    # round with both (with 2 s it can form without the later one, and torch's restart to take it in can stall)
    b = ClusterBench(root, 2, 100_000, last_call_s=5.0)
    benches.append(b)
    try:
        # 10 Mbit/s links: the group trains long enough for a loss late in its first interval
        return b.host_loss(how, phase, group_timeout_s=5.0, mbit=10, idle_exit_s=3.0)
    finally:
        b.close()


@needs_netns
@pytest.mark.timeout(900)
def test_a_trainer_host_lost_at_three_points_of_a_checkpoint_cycle_loses_nothing_and_serving_answers(tmp_path):
    """A 2-host group (elastic, torchrun on each host as on separate machines) loses its second host 10%, 50%
    and 90% into a checkpoint interval (killed, cut, killed): the first host goes on as a group of one from the
    last complete checkpoint, every record ends consumed by the final checkpoint, what is trained twice stays
    within one interval, and serving on the broker's host answers Predict throughout with newer versions.
    The three losses run at once, each on a cluster of its own: most of a run is waiting (on a 10 Mbit/s
    link, on a lost host's timeout, on the idle exit), not computing."""
    from concurrent.futures import ThreadPoolExecutor

    benches: list = []
    with ThreadPoolExecutor(len(LOSSES)) as pool:
        runs = {(how, phase): pool.submit(_lose_a_host, tmp_path / f"{how}-{int(phase * 100)}", how, phase, benches)
                for how, phase in LOSSES}
    for (how, phase), run in runs.items():
        x = run.result()
        where = f"{how} at {phase:.0%}: {x}; logs in {tmp_path / f'{how}-{int(phase * 100)}' / 'hosts'}"
        assert not x["after_end"], "the loss came after the last event: " + where
        assert x["detect_s"] is not None and x["detect_s"] <= 30, where
        assert x["recover_s"] is not None and x["recover_s"] >= x["detect_s"], where
        assert x["events_lost"] == 0, where
        assert x["events_duplicated"] is not None and x["events_duplicated"] <= x["duplicates_bound"], where
        assert x["predict_ok"] > 0 and x["predict_failed"] == 0, where
        first, last = x["served_versions"]
        assert last > first, where  # the smaller group's snapshots reached serving
    assert len(benches) == len(LOSSES)
    assert not any(h.ns in _namespaces() for b in benches for h in b.cluster.hosts)


@pytest.mark.parametrize("log, expected", [
    ("torch.distributed.DistStoreError: wait timeout after 60000ms, keys: /torch.rendezvous.none.1/x", "not formed"),
    ("streamrec train: the config says no", "failed"),
])
def test_a_host_loss_run_whose_group_never_formed_is_told_from_other_start_failures(tmp_path, log, expected):
    """Only torchrun giving up in the rendezvous is a group that never formed (the run is started again once);
    any other exit of host 1's trainer before training fails the run."""
    from types import SimpleNamespace

    from streamrec.benchmarks.bench_cluster import ClusterBench, GroupNotFormed

    (tmp_path / "h1.log").write_text(f"Traceback (most recent call last):\n{log}\n")
    exited = SimpleNamespace(poll=lambda: 1, returncode=1)
    bench = SimpleNamespace(root=tmp_path)
    with pytest.raises(RuntimeError) as e:
        ClusterBench._wait_going(bench, "loss-kill-10", {1: exited}, [tmp_path / "h1.log"], tmp_path / "none.jsonl")
    assert isinstance(e.value, GroupNotFormed) == (expected == "not formed"), e.value
    assert "did not get going (host 1's trainer exited 1)" in str(e.value) and log in str(e.value)
