"""The simulated hosts (``streamrec.benchmarks.netns``): network namespaces joined by veth links. Needs root and
iproute2. The harness removes every namespace, link and process it made, also when the test fails. A trainer group
across two of these hosts is run by ``bench cluster --tiny`` (tests/project/test_benches.py)."""

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
