"""A serving group's fan-out: a push that one process of the group receives is forwarded to the others.

The processes of a group (``serving.processes``, see ``group.py``) share the public port (SO_REUSEPORT:
the kernel hands each new connection to one of them), so a trainer's push lands on one process only.
That process forwards the verified snapshot to every sibling on the sibling's own loopback port
(``group.json`` in ``serving.data_dir`` maps process index -> port; the supervisor rewrites it when a
process restarts), with the group's key in ``SIBLING_HEADER`` so the sibling installs it without
forwarding it again. The push is answered once every sibling has answered:

- a sibling that took it, or could not be reached (down, restarting: its listening socket is closed,
  so it gets no requests either; it refuses the next delta when back, which makes the trainer's next
  snapshot full): accepted;
- a sibling that refused it for a reason a full snapshot mends (``FAILED_PRECONDITION``, ``DATA_LOSS``:
  it restarted behind the others): the push is answered with that refusal, naming the process, so the
  trainer's next snapshot is full for the whole group;
- any other refusal: answered with the sibling's code and reason.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

from streamrec.snapshot import SnapshotError, needs_full

log = logging.getLogger("streamrec.serving")

GROUP_FILE = "group.json"  # in serving.data_dir: {"ports": {"<index>": <loopback port>}}
SIBLING_HEADER = "x-streamrec-sibling"  # metadata of a forwarded push: the group's key
UNREACHABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})


def write_group_file(root: Path, ports: dict[int, int]) -> Path:
    """Write ``group.json`` atomically (a reader sees the old or the new map, never half of one)."""
    path = Path(root) / GROUP_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"ports": {str(i): int(p) for i, p in sorted(ports.items())}}))
    os.replace(tmp, path)
    return path


def read_group_file(root: Path) -> dict[int, int]:
    """Process index -> loopback port, from ``group.json`` ({} when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(root) / GROUP_FILE).read_text())
        return {int(i): int(p) for i, p in data["ports"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


@dataclass
class Forwarded:
    """What one sibling answered a forwarded push."""

    index: int
    ok: bool
    code: str = "OK"
    reason: str = ""


class Siblings:
    """The other processes of this process's serving group, and the forwarding of pushes to them."""

    def __init__(self, root: Path, index: int, key: str, push_token: str = "", max_message_mb: int = 64,
                 timeout_s: float = 300.0, attempts: int = 3):
        self.root = Path(root)
        self.index = index
        self.key = key
        self.push_token = push_token
        self.max_message_mb = max_message_mb
        self.timeout_s = timeout_s
        self.attempts = attempts  # a sibling that is restarting may answer UNAVAILABLE for a moment
        self._pushers: dict[str, object] = {}  # target -> its pusher, shared by the forwarding threads
        self._pushers_lock = threading.Lock()
        self._pool = futures.ThreadPoolExecutor(4, thread_name_prefix="sibling-push")
        self.unreachable = 0  # forwards that reached no sibling process (it was down)

    def is_sibling_call(self, context) -> bool:
        """True when the call carries this group's key: a push forwarded by a sibling (not forwarded again)."""
        for k, v in context.invocation_metadata() or ():
            if k == SIBLING_HEADER:
                return hmac.compare_digest(str(v).encode(), self.key.encode())
        return False

    def targets(self) -> dict[int, str]:
        """Index -> ``127.0.0.1:port`` of every other process of the group, as ``group.json`` says now."""
        return {i: f"127.0.0.1:{p}" for i, p in read_group_file(self.root).items() if i != self.index}

    def _pusher(self, target: str):
        from .client import SnapshotPusher

        with self._pushers_lock:  # two pushes forwarded at once must not each make (and leak) a pusher
            if target not in self._pushers:
                self._pushers[target] = SnapshotPusher(target, token=self.push_token, attempts=self.attempts,
                                                       backoff_s=0.2, timeout_s=self.timeout_s,
                                                       max_message_mb=self.max_message_mb,
                                                       extra_metadata=((SIBLING_HEADER, self.key),))
            return self._pushers[target]

    def _forward_one(self, index: int, target: str, snapshot_dir: Path) -> Forwarded:
        try:
            r = self._pusher(target).push(snapshot_dir)
        except Exception as e:  # the pusher reports gRPC failures in its result; anything else is ours
            return Forwarded(index, False, "INTERNAL", f"{type(e).__name__}: {e}")
        if not r.ok and r.code in UNREACHABLE:
            with self._pushers_lock:  # a new channel next time (the port may have changed)
                dead = self._pushers.pop(target, None)
            if dead is not None:
                dead.close()
        return Forwarded(index, r.ok, r.code, r.reason)

    def start_forward(self, snapshot_dir: Path) -> list[futures.Future]:
        """Start pushing ``snapshot_dir`` to every sibling at once; :meth:`verdict` waits for the answers."""
        return [self._pool.submit(self._forward_one, i, t, Path(snapshot_dir)) for i, t in self.targets().items()]

    def verdict(self, jobs: list[futures.Future], version: int) -> list[Forwarded]:
        """Wait for every forward of ``jobs``; raise ``SnapshotError`` for a refusal the pusher must hear
        (see the module docstring), else return the answers (unreachable siblings logged)."""
        answers = [j.result() for j in jobs]
        refused = []
        for a in answers:
            if a.ok:
                continue
            if a.code in UNREACHABLE:
                self.unreachable += 1
                log.warning("serving process %d did not get version %d (%s: %s); it catches up from a later push",
                            a.index, version, a.code, a.reason)
            else:
                refused.append(a)
        if refused:
            first = next((a for a in refused if needs_full(a.code)), refused[0])
            raise SnapshotError(f"serving process {first.index} of this group refused version {version}: "
                                f"{first.reason}" + ("; send a full snapshot" if needs_full(first.code) else ""),
                                code=first.code)
        return answers

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        with self._pushers_lock:
            pushers, self._pushers = list(self._pushers.values()), {}
        for p in pushers:
            p.close()
