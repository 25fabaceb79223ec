"""Running the command blocks a page shows, as a reader would: long-running commands in the background (each in
its own session, its output in a log file), the others in the foreground until they exit."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path


def start_background(name: str, argv: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """Start ``argv`` in its own session, output to ``log``; for the broker, wait for its address line."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    if name == "broker":  # the others need it
        deadline = time.monotonic() + 60
        while "Ctrl-C stops it" not in log.read_text():
            assert proc.poll() is None, f"broker exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"broker did not start:\n{log.read_text()}"
            time.sleep(0.2)
    return proc


def run_foreground(name: str, argv: list[str], cwd: Path, env: dict,
                   background: list[tuple[str, subprocess.Popen, Path]]) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end (``predict`` again until a model is served, up to 240 s); every background
    process must still run before it, and it must exit 0 (the assertion shows the background logs)."""
    for other, p, plog in background:
        assert p.poll() is None, f"{other} exited with {p.returncode}:\n{plog.read_text()[-3000:]}"
    deadline = time.monotonic() + 240
    while True:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
        if r.returncode == 0 or name != "predict" or time.monotonic() > deadline:
            break
        assert "UNAVAILABLE" in r.stderr, r.stderr  # no model yet: anything else is a failure
        time.sleep(2)
    logs = "\n".join(f"--- {n}\n{lp.read_text()[-2500:]}" for n, _, lp in background)
    assert r.returncode == 0, f"{shlex.join(argv[3:])} -> {r.returncode}\n{r.stderr[-3000:]}\n{logs}"
    return r


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL to its whole session after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
