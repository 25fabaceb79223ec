"""Children of a :class:`~streamrec.app.procs.Supervisor` (the demo's, ``streamrec join --workers``'): started
while the parent's own threads run (nothing executes in Python between fork and exec), each in a process group
of its own, and gone when the parent is SIGKILLed (they tie themselves to it as they start)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streamrec.app.procs import pid_alive

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]

# The parent: threads that allocate and load libraries all along and a gRPC channel trying to connect (its
# threads), then two `streamrec serve` children started among them; it prints the children's pids and sleeps
# until it is killed.
PARENT = textwrap.dedent("""
    import ctypes, json, sys, threading, time
    from pathlib import Path
    import grpc
    from streamrec.app.procs import Supervisor

    def churn():
        while True:
            ctypes.CDLL("libc.so.6")
            [dict(a=i) for i in range(1000)]

    for _ in range(2):
        threading.Thread(target=churn, daemon=True).start()
    channel = grpc.insecure_channel("127.0.0.1:9")  # gRPC's own threads, as the demo's client has
    grpc.channel_ready_future(channel).add_done_callback(lambda f: None)
    run = Path(sys.argv[1])
    sup = Supervisor(run / "logs")
    kids = [sup.start(f"serve{i}", [sys.executable, "-m", "streamrec", "serve", "--set", "serving.port=0",
                                    "--set", f"serving.data_dir={run / f'serving{i}'}"]) for i in range(2)]
    print(json.dumps([k.pid for k in kids]), flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_start_among_the_parents_threads_and_die_with_it(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        pids = json.loads(parent.stdout.readline())
        logs = [tmp_path / "logs" / f"serve{i}.log" for i in range(2)]
        deadline = time.monotonic() + 120
        while not all(lg.exists() and b"serving on" in lg.read_bytes() for lg in logs):
            assert all(pid_alive(p) for p in pids), [lg.read_text(errors="replace")[-2000:] for lg in logs]
            assert time.monotonic() < deadline, "the children did not come up"
            time.sleep(0.2)
        for p in pids:  # each leads a process group of its own: a Ctrl-C to the parent's group misses them
            assert os.getpgid(p) == p
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while any(pid_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"children outlived their SIGKILLed parent: {pids}"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        for p in pids if "pids" in locals() else []:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


TIE = ("import os, sys\n"
       "from streamrec.app.procs import PARENT_PID_ENV, tie_to_supervisor\n"
       "os.environ[PARENT_PID_ENV] = sys.argv[1]\n"
       "tie_to_supervisor()\n"
       "print(os.environ.get(PARENT_PID_ENV))\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_takes_the_variable_out_and_exits_when_its_parent_is_already_another():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tied = subprocess.run([sys.executable, "-c", TIE, str(os.getpid())], capture_output=True, text=True, env=env,
                          timeout=60)
    assert tied.returncode == 0 and tied.stdout.strip() == "None", tied  # its own children are not tied to us
    orphan = subprocess.run([sys.executable, "-c", TIE, "999999999"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert orphan.returncode == 1 and orphan.stdout == "", orphan  # its parent is not the one that started it


def test_a_process_dies_with_another_it_watches_and_at_once_when_that_one_is_gone():
    """:func:`~streamrec.foundation.die_with`: a rank forked by a fork server watches the agent, not its parent."""
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    code = "import sys, time; from streamrec.foundation import die_with; die_with(int(sys.argv[1])); time.sleep(600)"
    watcher = subprocess.Popen([sys.executable, "-c", code, str(watched.pid)], cwd=ROOT)
    try:
        time.sleep(1.0)
        assert watcher.poll() is None  # the watched process lives: so does the watcher
        watched.kill()
        watched.wait(10)
        assert watcher.wait(15) == -signal.SIGKILL
        late = subprocess.run([sys.executable, "-c", code, str(watched.pid)], cwd=ROOT, timeout=60)
        assert late.returncode == -signal.SIGKILL  # watching a process already gone ends the watcher at once
    finally:
        for p in (watched, watcher):
            if p.poll() is None:
                p.kill()
