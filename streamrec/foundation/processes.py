"""Stopping a child process, and tying one to its parent or to another process.

One rule for every place that starts processes (the demo's supervisor, the benchmarks):
send ``sig`` (SIGTERM), wait ``grace`` seconds, then SIGKILL (its whole process group when
``group``), because some workers (faust) may ignore SIGTERM and a stop must always end.

A process that must not outlive its parent asks the kernel for SIGKILL when the parent dies
(Linux ``PR_SET_PDEATHSIG``): :func:`die_with_parent` from the process itself, or
:func:`set_pdeathsig` between fork and exec for a child that cannot (a binary that is not
Python). One that must not outlive another process than its parent (a rank forked by a fork
server, which lives as long as its ranks, outliving the agent that supervises them) watches
that process: :func:`die_with`. libc's ``prctl`` is looked up when this module is imported, so
that call loads nothing in a forked copy, where loading a library could deadlock on a lock
another thread held at the fork.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


_PRCTL = _libc_prctl()


def set_pdeathsig() -> bool:
    """SIGKILL this process when its parent dies; False where the platform has no such call (module doc)."""
    if _PRCTL is None:
        return False
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    return True


def die_with_parent(parent: int | None = None) -> None:
    """:func:`set_pdeathsig`, and exit at once when the parent already died: its parent is then ``init`` or,
    with ``parent`` (the pid the parent had), another process."""
    if set_pdeathsig() and (os.getppid() == 1 or (parent is not None and os.getppid() != parent)):
        os._exit(1)


def die_with(pid: int) -> None:
    """SIGKILL this process when process ``pid`` exits, or at once when it already has. A daemon thread waits
    on a pidfd of ``pid`` (Linux), or where there is none checks every second that ``pid`` still exists."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
        return
    except (AttributeError, OSError):  # no pidfd on this platform or kernel
        fd = None
    threading.Thread(target=_kill_self_when_gone, args=(pid, fd), name=f"die-with-{pid}", daemon=True).start()


def _kill_self_when_gone(pid: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # a pidfd reads as ready once its process has exited
    else:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:  # it exists, owned by another user
                pass
    os.kill(os.getpid(), signal.SIGKILL)


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
