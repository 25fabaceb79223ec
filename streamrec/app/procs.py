"""Supervision of the pipeline's child processes (demo and tests).

Children run in their own process group, die with their parent
(``PR_SET_PDEATHSIG``), and are stopped by pid: SIGTERM (or SIGINT), then
SIGKILL after a grace period, because some workers (faust) may ignore SIGTERM.

Nothing runs in Python between fork and exec (no ``preexec_fn``): a parent may start a child while its
own threads (a producer, gRPC and Kafka clients) hold locks, and a forked copy that calls into the
interpreter or the dynamic loader then can deadlock or crash. The process group is set by ``Popen``
itself (``process_group``), and the child ties itself to its parent as it starts
(:func:`tie_to_supervisor`, run by the CLI: :data:`PARENT_PID_ENV` names the parent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from streamrec.foundation import die_with_parent, stop_process


PARENT_PID_ENV = "STREAMREC_PARENT_PID"  # set for a supervised child: the pid it must not outlive


def tie_to_supervisor() -> None:
    """For a child a :class:`Supervisor` started (:data:`PARENT_PID_ENV` set): die with that parent. The
    variable is removed, so this process's own children are not taken for the supervisor's."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent and parent.isdigit():
        die_with_parent(int(parent))


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    expected_exit: bool = False  # a child that finishes its job (trainer with max_events)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close_log(self) -> None:
        """Close the parent's handle on the child's log file; closing twice is a no-op."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def poll(self) -> int | None:
        return self.proc.poll()

    def tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


class Supervisor:
    """Starts named children with logs in ``log_dir`` and stops them all, escalating to SIGKILL."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict | None = None, expected_exit: bool = False) -> Child:
        """Start ``argv`` (a ``streamrec`` command: its CLI ties it to this process, :func:`tie_to_supervisor`)
        in a process group of its own, its output in ``log_dir/NAME.log``."""
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        full_env[PARENT_PID_ENV] = str(os.getpid())
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, process_group=0)
        child = Child(name, proc, log_path, expected_exit, log)
        self.children.append(child)
        self._write_pids()
        return child

    def _write_pids(self) -> None:
        """``pids.json`` beside the logs: lets operators and tests find (and check) every child."""
        import json

        tmp = self.log_dir / "pids.json.tmp"
        tmp.write_text(json.dumps({c.name: c.pid for c in self.children}))
        tmp.replace(self.log_dir / "pids.json")

    def dead(self) -> list[Child]:
        """Children that exited when they were not expected to (or expected ones that failed)."""
        out = []
        for c in self.children:
            rc = c.poll()
            if rc is None:
                continue
            if not c.expected_exit or rc != 0:
                out.append(c)
        return out

    def stop(self, child: Child, grace: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        stop_process(child.proc, grace, sig, group=True)
        child.close_log()
        return child.proc.returncode

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop in reverse start order: consumers drain (and push their last snapshot) while
        the services they talk to are still up."""
        for c in reversed(self.children):
            self.stop(c, grace=grace)

    def stop_together(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> list[Child]:
        """Send ``sig`` to every running child at once, give them all ``grace`` seconds together, then
        SIGKILL the process group of each still running; the children that needed SIGKILL."""
        live = [c for c in self.children if c.poll() is None]
        for c in live:
            try:
                c.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        killed = []
        for c in live:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(c)
                stop_process(c.proc, 0.0, signal.SIGKILL, group=True)
            c.close_log()
        return killed

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]


def watch_children(sup: Supervisor, poll_s: float = 0.2) -> tuple[Child | None, int | None]:
    """Wait until a child of ``sup`` dies when it was not expected to, or SIGINT/SIGTERM reaches this
    process: ``(that child, None)`` or ``(None, the signal)``. The children run in their own process
    groups, so a terminal's Ctrl-C reaches only this process, which decides what they get; the previous
    signal handlers are back on return."""
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not received:
            dead = sup.dead()
            if dead:
                return dead[0], None
            time.sleep(poll_s)
        return None, received[0]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
