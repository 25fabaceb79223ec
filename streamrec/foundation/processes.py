"""Stopping a child process: ask politely, then insist.

One rule for every place that starts processes (the demo's supervisor, the benchmarks):
send ``sig`` (SIGTERM), wait ``grace`` seconds, then SIGKILL (its whole process group when
``group``), because some workers (faust) may ignore SIGTERM and a stop must always end.
"""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process(proc: subprocess.Popen, grace: float = 10.0, sig: int = signal.SIGTERM,
                 group: bool = False) -> int | None:
    """Stop ``proc`` (no-op if it already exited) and return its exit status."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            if group:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.kill()
            proc.wait(5)
    return proc.returncode
