"""The embedded broker's lifecycle: a clean stop, and no orphan when the parent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from streamrec.ingest import EmbeddedBroker

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gone(pid: int) -> bool:
    """True when the process no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
        return "Z" in state.split()[1]
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return True


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_broker_stops_cleanly():
    b = EmbeddedBroker().start()
    pid, port = b.proc.pid, b.port
    assert b.alive() and _listening(port)
    b.stop()
    assert not b.alive() and _gone(pid)
    assert not _listening(port)
    b.stop()  # a second stop is harmless


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_broker_dies_with_its_parent():
    script = ("import time\nfrom streamrec.ingest import EmbeddedBroker\n"
              "b = EmbeddedBroker().start()\nprint(b.proc.pid, b.port, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = parent.stdout.readline()
        assert line, "the parent did not start a broker"
        child, port = map(int, line.split())
        assert not _gone(child) and _listening(port)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # the leader thread shows as a zombie while the broker's other threads are still
        # exiting (and holding the listening socket): wait for both, within the deadline
        deadline = time.monotonic() + 15
        while (not _gone(child) or _listening(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child), "the broker outlived its SIGKILLed parent"
        assert not _listening(port), "the broker's port still accepts connections 15 s after its parent died"
    finally:
        if parent.poll() is None:
            parent.kill()
        if "child" in locals() and not _gone(child):
            os.kill(child, signal.SIGKILL)
