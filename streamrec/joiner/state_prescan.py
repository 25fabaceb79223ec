"""The join state's due-time heaps, read from the kept local databases while the worker joins its group.

A restarted worker waits for the broker to form its group (seconds) before it learns which partitions it
owns, and only then restores each one; the largest part of a restore is reading every stored row to
rebuild the heaps that find what is due (:func:`~.machine.due_heaps`). :class:`StatePrescan` reads them
ahead, in a thread started as the worker asks to join, from each local database that
:func:`~.local_state.check_local_state` kept, each opened read-only and closed before faust opens any
(:meth:`StatePrescan.finish`, called by the joiner's table manager before its first rebalance opens them).

A partition's heaps read ahead are used only when its database holds exactly what was read: the
:func:`~.txstore.fingerprint` taken with them equals the one the restore finds after faust's changelog
recovery (:meth:`StatePrescan.take`), and the restore writes nothing before it rebuilds the join.
Anything else (faust read newer batches from the changelog, the last batch was applied again, the read
was stopped, failed, or never reached the partition) leaves the restore to read the rows itself, as it
does without a prescan.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from .machine import DueHeaps, JoinRules, due_heaps
from .txstore import fingerprint, prefixed_items, state_items, state_prefix

log = logging.getLogger(__name__)


class StatePrescan:
    """Reads the heaps of the databases ``dbs`` (partition -> path) under ``rules`` in a thread."""

    def __init__(self, dbs: dict[int, Path], rules: JoinRules):
        self.dbs = dict(dbs)
        self.rules = rules
        self._read: dict[int, tuple[tuple[bytes | None, bytes | None], DueHeaps]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StatePrescan":
        """Start reading (nothing to read, started already or finished: nothing starts)."""
        if self.dbs and self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="join-state-prescan", daemon=True)
            self._thread.start()
        return self

    def reading(self) -> bool:
        """Whether the read is still going on."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait until every database is read (or the read stopped)."""
        if self._thread is not None:
            self._thread.join()

    def finish(self) -> None:
        """Stop reading and wait until every database this prescan opened is closed again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def take(self, p: int, now: tuple[bytes | None, bytes | None]) -> DueHeaps | None:
        """Partition ``p``'s heaps as read ahead, when its database's fingerprint is still ``now`` (each
        partition's are handed out once)."""
        got = self._read.pop(p, None)
        if got is None or got[0] != now:
            return None
        return got[1]

    def discard(self) -> None:
        """Drop every partition's heaps not taken (the worker's first restore is done: a partition assigned
        later has had another owner, whose batches changed its database)."""
        self._read.clear()

    def _run(self) -> None:
        for p, path in sorted(self.dbs.items()):
            if self._stop.is_set():
                return
            try:
                got = self._read_one(p, path)
            except Exception as e:  # rocksdict's own exception types: the restore reads this partition itself
                log.info("partition %d: the local join state was not read ahead (%s)", p, str(e)[:200])
                continue
            if got is not None:
                self._read[p] = got

    def _yield(self) -> bool:
        """Whether to stop; first lets the worker's own threads run (the read holds the GIL otherwise, and
        each of their waits for it would delay the group join it overlaps)."""
        time.sleep(0)
        return self._stop.is_set()

    def _read_one(self, p: int, path: Path):
        import rocksdict

        db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True),
                             access_type=rocksdict.AccessType.read_only())
        try:
            fp = fingerprint(db.get, p)
            prefix = state_prefix(p)
            heaps = due_heaps(self.rules, state_items(prefixed_items(db, prefix), prefix), self._yield)
        finally:
            db.close()
        return None if heaps is None else (fp, heaps)
