"""The versions one server holds and which of them users get: the head, the kept, the held, the pinned.

Two pointers, kept apart on purpose:

- the **head** is the newest version installed: every push is installed (checked, loaded, recorded) and a
  delta builds on the head, whether or not users get it, so the trainer's chain never breaks while a version
  is held back or a rollback is pinned;
- the **served** version (``StreamRecService.current``) is what Predict scores with. It moves only when the
  guard (``guard.py``) promotes a version, an operator rolls back or releases a pin, or accepts a held
  version.

The last ``serving.keep_versions`` promoted versions stay loaded (store open, memory rows built), so a
rollback is one reference swap. Every other version is retired (its directory removed) as soon as it is
neither the head, the served one, nor kept. Versions installed while pinned are judged as usual; those that
pass join the kept ones (promoted, not served) and the newest of them is served on release.

What a restart needs is persisted in ``serving-state.json`` under ``serving.data_dir`` (written to a
temporary file, fsynced, renamed): the served version, whether it is pinned, the kept versions, why the head
is held, and the guard's histories. A restart restores the head (the newest version that verifies), every
kept version, and serves the one the state names; without a state file it serves the head, as before.

The guard judges each version on its evidence and on the **golden set** (``golden.py``): the evidence
samples of promoted versions, scored by each promoted version at its promotion and by each candidate when
it is judged. A restart builds the golden set again from the kept versions' samples.

**Settling.** After a hold the guard wants ``recovery_versions`` passing versions in a row; a head that
passes but is held only for that count (``recovering``) and stays the newest for ``serving.guard.settle_s``
is promoted anyway (``promote_settled``): a paused stream sends no further version, and users would
otherwise keep an older model for as long as the pause lasts. The book checks when a timer it starts at
such a verdict fires (``on_settle``: the server's re-check, which serves what ``promote_settled`` returns).

**Live drift.** While the head is not the promoted version, live requests answered by the promoted version
are scored by the head too (``drift.py``), and the book keeps the paired figures of that head
(``drift``). A head that waits as ``recovering`` (for the recovery count or ``settle_s``) and whose figures
the guard finds clearly beyond ``serving.guard.drift_max`` is held as ``drift``: the count starts again,
as after any hold, and it never settles. A version that passes and is promoted at its push never waits for
live figures, so drift costs a clean stream no freshness; too few live requests leave the head to the rules
above.

The served version sits behind one small interface (``served`` in, the version to serve out) so that a later
split of traffic over several model lines can keep one book per line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from streamrec.embedding_store.store_config import StoreConfig
from streamrec.serving.serving_config import ServingConfig
from streamrec.snapshot import SnapshotError, read_evidence

from .drift import MAX_EVENTS as DRIFT_MAX_EVENTS, DriftFigures
from .golden import GoldenComparison, GoldenSet
from .guard import Guard, Verdict
from .version import ServedVersion, restore_newest, restore_version

log = logging.getLogger("streamrec.serving")

STATE = "serving-state.json"


class VersionBook:
    """See the module docstring. Calls that change the book hold its lock; the server swaps ``current``."""

    def __init__(self, root: Path, serving: ServingConfig, store_cfg: StoreConfig,
                 on_settle: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic):
        """``serving``: the line's section (kept versions, guard); ``store_cfg``: the settings restored
        versions open their stores with; ``on_settle``: called (on a timer thread) when a held head may have
        settled, to call ``promote_settled`` and serve what it returns; ``clock``: seconds, for settling."""
        self.root = Path(root)
        self.versions_root = self.root / "versions"
        self.store_cfg = store_cfg
        self.keep = int(serving.keep_versions)
        self.guard = Guard(serving.guard)
        self.golden = GoldenSet(serving.guard.golden_events if serving.guard.enabled else 0)
        self.settle_s = float(serving.guard.settle_s)
        self.on_settle, self.clock = on_settle, clock
        self._settling: tuple[int, float] | None = None  # (head version, since) while it waits as `recovering`
        self._timer: threading.Timer | None = None
        self.head: ServedVersion | None = None
        self.kept: list[ServedVersion] = []  # promoted versions, oldest first
        self.pinned = False
        self.held_reason = ""  # why the head is held back ("" = it is not)
        self.held_total: Counter = Counter()  # versions held, by reason
        self.rollbacks = 0
        self._all: dict[int, ServedVersion] = {}  # every version the book holds open
        self.drift: DriftFigures | None = None  # the head's live scores paired with the promoted version's (drift.py)
        self.lock = threading.RLock()

    # -- restore -------------------------------------------------------------------------------
    def _read_state(self) -> dict:
        p = self.root / STATE
        if not p.exists():
            return {}
        try:
            d = json.loads(p.read_text())
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError) as e:
            log.warning("%s unreadable (%s): serving the newest stored version, unpinned", p, e)
            return {}

    def restore(self, device, skipped: list) -> ServedVersion | None:
        """Open what a previous process left (see the module docstring); the version to serve, or None."""
        st = self._read_state()
        kept_ns = [int(n) for n in st.get("kept", []) if isinstance(n, int)]
        served_n = st.get("served") if isinstance(st.get("served"), int) else None
        keep = set(kept_ns) | ({served_n} if served_n else set())
        head = restore_newest(self.versions_root, self.store_cfg, device, skipped, keep=keep)
        if head is None:
            return None
        self.head = head
        self._all[head.version] = head
        for n in sorted(keep):
            if n == head.version or n > head.version:
                continue
            vdir = self.versions_root / f"v{n:012d}"
            try:
                v = restore_version(vdir, self.store_cfg, device)
            except Exception as e:  # a kept version that no longer verifies: not offered for rollback
                log.warning("kept version %d not restored: %s: %s", n, type(e).__name__, e)
                continue
            self._all[n] = v
        self.kept = [self._all[n] for n in kept_ns if n in self._all]
        for k in self.kept:
            self._add_golden(k, k.manifest.evidence)
        if isinstance(st.get("guard"), dict):
            self.guard.load_state(st["guard"])
        self.held_reason = str(st.get("held_reason", "")) if st.get("head") == head.version else ""
        served = self._all.get(served_n) if served_n else None
        self.pinned = bool(st.get("pinned")) and served is not None
        if served is None:
            served = self.kept[-1] if self.kept and self.held_reason else head
        if served is not head and not self.pinned and head.version > int(st.get("head") or 0):
            # installed after the state was written (a stop during its install): judged now, as a push would be
            verdict = self.guard.decide(head.manifest.evidence, self._golden_for(head))
            if verdict.ok:
                served = head
            else:
                self.held_reason = f"{verdict.reason}: {verdict.detail}"
        if served is not head and self.held_reason.startswith("recovering"):
            self._await_settle(head)  # it waits its settle_s again from this start
        if served is head and (not self.kept or self.kept[-1] is not head):
            self._promote(head, head.manifest.evidence, reset=not self.guard.history.promoted)
        if self.pinned:
            log.warning("version %d is pinned (a rollback): newer versions wait for `streamrec rollback --release`",
                        served.version)
        return served

    # -- changes -------------------------------------------------------------------------------
    def precheck(self, manifest) -> None:
        """A manifest the guard cannot judge is refused before a byte of its snapshot is stored."""
        if self.guard.enabled and manifest.evidence is None:
            raise SnapshotError("manifest.evidence: the snapshot carries no quality evidence and serving.guard is on "
                                "(a trainer writes it; serving.guard.enabled = false serves versions unchecked)",
                                code="INVALID_ARGUMENT")

    def acquire_head(self, served) -> ServedVersion | None:
        """A reference on the head (the served version, ``served()``, while there is none), for a delta to
        build on."""
        while True:
            v = self.head or served()
            if v is None or v.acquire():
                return v

    def add(self, v: ServedVersion, served: ServedVersion | None) -> Verdict:
        """``v`` was installed (the new head): judge it; ok means serve it now."""
        with self.lock:
            self.head = v
            self._all[v.version] = v
            ev = v.manifest.evidence
            if served is None:
                self._promote(v, ev, reset=not self.guard.history.promoted)
                return Verdict(True)
            verdict = self.guard.decide(ev, self._golden_for(v))
            self._settling = None
            if verdict.reason == "recovering":
                self._await_settle(v)
            if verdict.ok:
                self._promote(v, ev)
                self.held_reason = ""
                if self.pinned:
                    return Verdict(False, "pinned", f"version {served.version} is pinned")
                return verdict
            self._record_hold(v.version, verdict, served.version)
            return verdict

    def _promote(self, v: ServedVersion, ev, reset: bool = False) -> None:
        if reset:
            self.guard.reset(ev)
            self.golden.clear()  # the stream changed (or nothing was promoted yet): its old events do not judge
        else:
            self.guard.promoted(ev)
        self._add_golden(v, ev)
        self.kept.append(v)

    def _add_golden(self, v: ServedVersion, ev) -> None:
        """``v`` was promoted: its evidence sample joins the golden set, which ``v`` scores."""
        if self.golden.max_events:
            sample = read_evidence(ev).sample if ev is not None else None
            self.golden.promoted(sample, v.predict, v.fields, v.dense_dim)

    def _golden_for(self, v: ServedVersion) -> GoldenComparison | None:
        return self.golden.compare(v.predict) if self.golden.max_events else None

    def drift_candidate(self, answered: int) -> int:
        """The version whose live scores pair with an answer of version ``answered`` (0: none): the head,
        while it is not the promoted version and ``answered`` is (drift.py). Read without the lock: called
        on the answer path, and a stale read only pairs a request that ``drift_seen`` then drops."""
        head, kept, d = self.head, self.kept, self.drift
        if not self.guard.enabled or head is None or not kept or head is kept[-1] or kept[-1].version != answered:
            return 0
        if d is not None and d.candidate == head.version and d.promoted == answered and d.events >= DRIFT_MAX_EVENTS:
            return 0
        return head.version

    def drift_seen(self, candidate: ServedVersion, promoted: int, pairs, served: ServedVersion | None) -> None:
        """``pairs`` (candidate scores, promoted scores) of live requests join the head's drift figures. A head
        that waits only for the recovery count or the settle rule (``recovering``) and whose figures the guard
        finds clearly beyond ``drift_max`` is held as ``drift``: the recovery count starts again and it never
        settles. A version promoted at once is never waited on for these figures."""
        with self.lock:
            if self.head is not candidate or not self.kept or self.kept[-1].version != promoted:
                return
            d = self.drift
            if d is None or (d.candidate, d.promoted) != (candidate.version, promoted):
                d = self.drift = DriftFigures(candidate.version, promoted)
            for cand, prom in pairs:
                d.add(cand, prom)
            if not self.held_reason.startswith("recovering"):
                return
            verdict = self.guard.judge_drift(d)
            if verdict.ok:
                return
            self.guard.passing = 0
            self._settling = None
            self._record_hold(candidate.version, verdict, promoted)
            self._persist(served)

    def _record_hold(self, version: int, verdict: Verdict, serving: int) -> None:
        """Count and state the hold of ``version`` (its reason shows in Status until the next verdict)."""
        self.held_total[verdict.reason] += 1
        self.held_reason = f"{verdict.reason}: {verdict.detail}"
        log.warning("version %d held back (%s); still serving %d", version, verdict.detail, serving)

    def _await_settle(self, v: ServedVersion) -> None:
        """``v`` passed and waits only for the recovery count: it settles after ``settle_s`` as the newest."""
        if not self.settle_s:
            return
        self._settling = (v.version, self.clock())
        if self.on_settle is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.settle_s + 0.05, self.on_settle)
            self._timer.daemon = True
            self._timer.start()

    def promote_settled(self, served: ServedVersion | None) -> ServedVersion | None:
        """Promote the head when it has settled (see the module docstring): it is returned to be served
        (None: nothing settled, or a pin keeps the served version; the head is then promoted, not served)."""
        with self.lock:
            s, head = self._settling, self.head
            if (s is None or head is None or head.version != s[0] or not self.held_reason.startswith("recovering")
                    or self.clock() - s[1] < self.settle_s):
                return None
            self._settling = None
            self.guard.passing = None
            self._promote(head, head.manifest.evidence)
            log.warning("version %d promoted: it passed and stayed the newest for %.0f s (settle_s; was held: %s)",
                        head.version, self.settle_s, self.held_reason)
            self.held_reason = ""
            if self.pinned or served is None:
                self.settle(served)
                return None
            return head

    def rollback(self, to: int, served: ServedVersion | None) -> ServedVersion:
        """The kept version to serve and pin: ``to``, or (0) the newest kept one older than ``served``."""
        with self.lock:
            if served is None:
                raise SnapshotError("nothing is served: nothing to roll back", code="FAILED_PRECONDITION")
            have = [k.version for k in self.kept]
            if to:
                target = next((k for k in self.kept if k.version == to), None)
            else:
                target = next((k for k in reversed(self.kept) if k.version < served.version), None)
            if target is None:
                want = f"version {to}" if to else f"a version older than {served.version}"
                raise SnapshotError(f"{want} is not kept (kept: {have or 'none'}; serving.keep_versions "
                                    f"{self.keep})", code="NOT_FOUND")
            self.pinned = True
            self.rollbacks += 1
            log.warning("rollback: serving version %d (was %d), pinned until `streamrec rollback --release`",
                        target.version, served.version)
            return target

    def release(self, served: ServedVersion | None) -> ServedVersion | None:
        """Unpin: the newest promoted version (versions that passed the guard while pinned included)."""
        with self.lock:
            self.pinned = False
            target = self.kept[-1] if self.kept else served
            log.info("rollback released: serving version %s", target.version if target else None)
            return target

    def accept(self, version: int, served: ServedVersion | None) -> ServedVersion:
        """Promote the held head (``version`` 0 or its number) and start the guard's histories from it."""
        with self.lock:
            if self.pinned:
                raise SnapshotError(f"version {served.version if served else 0} is pinned; release it first "
                                    "(`streamrec rollback --release`)", code="FAILED_PRECONDITION")
            head = self.head
            if head is None or not self.held_reason:
                raise SnapshotError("no version is held back", code="FAILED_PRECONDITION")
            if version and version != head.version:
                raise SnapshotError(f"version {version} is not the newest held version ({head.version}); only it "
                                    "can be accepted", code="FAILED_PRECONDITION")
            log.warning("version %d accepted by an operator (was held: %s); the guard's history starts from it",
                        head.version, self.held_reason)
            self._settling = None
            self._promote(head, head.manifest.evidence, reset=True)
            self.held_reason = ""
            return head

    def forget(self, v: ServedVersion) -> None:
        """Drop a damaged version from the book without retiring it (its directory stays for the operator)."""
        with self.lock:
            self._all = {n: x for n, x in self._all.items() if x is not v}
            self.kept = [k for k in self.kept if k is not v]
            if self.head is v:
                self.head = None

    def settle(self, served: ServedVersion | None) -> None:
        """Retire every version no longer needed (not the head, served, or kept) and persist the state."""
        with self.lock:
            self.kept = self.kept[-self.keep:] if self.keep else []
            live = {id(x) for x in (self.head, served, *self.kept) if x is not None}
            for n, v in list(self._all.items()):
                if id(v) not in live:
                    del self._all[n]
                    v.retire()
            self._persist(served)

    def _persist(self, served: ServedVersion | None) -> None:
        if served is None:
            return
        st = {"served": served.version, "pinned": self.pinned, "kept": [k.version for k in self.kept],
              "head": self.head.version if self.head is not None else 0, "held_reason": self.held_reason,
              "guard": self.guard.state(), "written_ms": int(time.time() * 1000)}
        p = self.root / STATE
        tmp = p.with_name(STATE + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(st, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except OSError as e:  # the served pointer still moved; a restart without the state serves the head
            log.error("cannot write %s: %s", p, e)

    def close(self) -> None:
        """Retire every version, keeping its directory for the next start."""
        with self.lock:
            if self._timer is not None:
                self._timer.cancel()
            for v in self._all.values():
                v.retire(keep_dir=True)
            self._all.clear()
            self.kept = []
            self.head = None

    # -- reading -------------------------------------------------------------------------------
    def status(self, resp, served: ServedVersion | None) -> None:
        """The book's part of a ``StatusResponse``."""
        with self.lock:
            resp.newest_version = self.head.version if self.head is not None else 0
            resp.pinned = self.pinned
            resp.held_reason = self.held_reason
            resp.versions_held = sum(self.held_total.values())
            resp.kept_versions.extend(k.version for k in self.kept)
            resp.guard_enabled = self.guard.enabled
            for k, x in (self.waiting_drift() or {}).items():
                setattr(resp.drift, k, x)

    def waiting_drift(self) -> dict | None:
        """The head's drift figures while it waits (it is not the promoted version), else None."""
        d, head = self.drift, self.head
        if d is None or head is None or d.candidate != head.version or not self.kept or self.kept[-1] is head:
            return None
        return d.figures()
