"""A worker thread that does work handed over by Predict after its answer, never on the answer's path.

The shadow line's scoring (``lines.py``) and the guard's live drift watch (``drift.py``) both score answered
requests again with another version. The caller only appends to a bounded queue (``put``: False, and
nothing queued, when ``max_pending`` items already wait); one daemon thread takes a round of queued items
(``pick``, under the queue's lock) and works on them (``work``) outside the lock; an exception there goes to
``failed`` and never reaches a caller.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


class OffPathWorker:
    """See the module docstring. ``pick(queue) -> items`` removes one round's items from the deque."""

    def __init__(self, name: str, pick: Callable[[deque], list], work: Callable[[list], None],
                 failed: Callable[[list, Exception], None], max_pending: int):
        self.pick, self.work, self.failed = pick, work, failed
        self.max_pending = int(max_pending)
        self._queue: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._stop = False
        self.refused = 0  # items ``put`` did not queue: max_pending were waiting
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item) -> bool:
        """Queue ``item``; False (not queued) when ``max_pending`` items wait already."""
        with self._lock:
            if len(self._queue) >= self.max_pending:
                self.refused += 1
                return False
            self._queue.append(item)
            self._wake.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._wake.wait()
                if self._stop:
                    return
                take = self.pick(self._queue)
                self._busy = True
            try:
                self.work(take)
            except Exception as e:  # a model error: the worker's to count, never an answer's
                self.failed(take, e)
            finally:
                with self._lock:
                    self._busy = False
                    if not self._queue:
                        self._idle.notify_all()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is queued or in progress (tests, benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while (self._queue or self._busy) and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            return not (self._queue or self._busy)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        self._thread.join(10)
