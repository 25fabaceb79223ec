"""How the server refuses calls: Predict refusals counted and slowed for a flooding client, and pushes
refused for the machine's sake.

:class:`Refusals` counts every Predict refusal by status code (``refused``). A client address refused
more often than ``TARPIT_AFTER`` times a second (past a burst of as many) gets further refusals
``serving.refusal_delay_ms`` late (``delayed`` counts them): a flood of bad calls (or token guesses)
slows to the pace of the delay instead of taking the server's CPU. Only refusals wait, never a good
call; at most ``max_waiting`` refusals wait at once (beyond that, they are answered at once).

A push that cannot be stored or installed because of the machine (disk full, read-only, no file
handles) is refused with RESOURCE_EXHAUSTED (pushers retry it) and one line naming what failed, the
path, the errno and what to do; one ERROR line per condition, WARNING while retries meet the same one,
until a push installs (:meth:`Refusals.push_installed`).
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from streamrec.foundation import as_resource_error, resource_error_line
from streamrec.serving.serving_config import ServingConfig

log = logging.getLogger("streamrec.serving")

TARPIT_AFTER = 10  # refusals per second one client address may have (and a burst of as many) before they are delayed
TARPIT_ADDRESSES = 10_000  # addresses remembered (the table is cleared of drained ones when it grows past this)


class Refusals:
    """Refusals of one server; ``serving.refusal_delay_ms`` is read at each refusal."""

    def __init__(self, serving: ServingConfig, max_waiting: int):
        self.serving = serving
        self.refused: dict[str, int] = {}  # Predict refusals by status code name, for tests and benchmarks
        self.delayed = 0  # refusals answered late
        self._recent: dict[str, tuple] = {}  # client address -> (refusals in its bucket, when last refused)
        self._waiting = threading.BoundedSemaphore(max(1, max_waiting))  # delayed refusals at once
        self._lock = threading.Lock()
        self._resource_refusal = None  # (errno, what failed) of the last push refused for the machine's sake

    def refuse(self, context, code: grpc.StatusCode, details: str):
        """Refuse a Predict (``context.abort``): counted, and late for an address refused too often."""
        address = (context.peer() or "").rpartition(":")[0]  # "ipv4:10.0.0.5:40112" -> "ipv4:10.0.0.5"
        now = time.monotonic()
        with self._lock:
            self.refused[code.name] = self.refused.get(code.name, 0) + 1
            if len(self._recent) > TARPIT_ADDRESSES:  # forget addresses whose bucket has drained
                self._recent = {a: b for a, b in self._recent.items() if b[0] - (now - b[1]) * TARPIT_AFTER > 0}
            # a leaky bucket per address: drains TARPIT_AFTER refusals a second, holds a burst of TARPIT_AFTER
            level, last = self._recent.get(address, (0.0, now))
            level = max(0.0, level - (now - last) * TARPIT_AFTER) + 1
            self._recent[address] = (level, now)
            late = level > TARPIT_AFTER
        delay = self.serving.refusal_delay_ms / 1000
        if late and delay > 0 and self._waiting.acquire(blocking=False):
            try:
                with self._lock:
                    self.delayed += 1
                time.sleep(delay)
            finally:
                self._waiting.release()
        context.abort(code, details)

    def refuse_push_for_resources(self, e: BaseException, context, served: int | None, staging) -> None:
        """Refuse a push that failed with the resource error ``e`` while version ``served`` (None: none) keeps
        serving; ``staging`` is where pushed snapshots are stored."""
        then = (f"The push is refused and version {served if served is not None else 'none'} keeps serving; the "
                "trainer retries it, and the next push once space is back is installed")
        line = resource_error_line(as_resource_error(e, "storing a pushed snapshot", str(staging)), then=then)
        key = (getattr(e, "errno", None), line.split(" at ", 1)[0])
        level = logging.WARNING if key == self._resource_refusal else logging.ERROR
        self._resource_refusal = key
        log.log(level, "push refused: %s", line)
        log.debug("the traceback of the refused push", exc_info=e)
        # the tracebacks' frames hold what the failed install read (the staged dense weights are a mapping of a
        # deleted file): dropped now, so that the space is free at once and not when the garbage collector runs
        seen, x = set(), e
        while x is not None and id(x) not in seen:
            seen.add(id(x))
            x.__traceback__ = None
            x = x.__cause__ or x.__context__
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"server: {line}")

    def push_installed(self) -> None:
        """A push installed: the next resource refusal is news again (logged at ERROR)."""
        self._resource_refusal = None
