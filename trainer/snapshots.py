"""Serving snapshots: full the first time (and whenever serving asks for one), deltas of the rows
changed since the last accepted push after that, pushed in the background. The trainer decides when:
every ``serving.push_every_s`` (freshness; see ``TrainerService.push``), not at its durable checkpoints.

Versions are this publisher's own, strictly increasing across restarts: :meth:`SnapshotPublisher.reserve_version`
writes each one to ``version_file`` (fsynced) before the snapshot is built, so a trainer that died after a
push (serving holds a version its checkpoint never saw) starts above it; a "not newer than served"
refusal that names the served version lifts the counter past it too (a lost ``version_file``).

Deltas are always taken relative to the last version serving *accepted*, and no
new snapshot is built while a push is still being retried, so a delta's parent is
always what serving holds. A failed push is retried with exponential backoff and
never blocks or stops training.

Several serving replicas (``serving.push_targets``) are pushed to as a group: a
snapshot counts as accepted once every replica has it (a retry goes only to the
ones still missing it), so the group's accepted version is held by all of them
and the next delta applies everywhere. A replica that refuses a delta (it lost or
never had the parent) makes the next snapshot full for all. A replica still missing
a snapshot ``give_up_s`` after it was built, while others have it, is left behind so
the rest keep getting fresh snapshots (each later one is tried on it once, without
waiting for it again); when it is back it refuses the next delta (its parent is
old), and that makes the following snapshot full for all.

A refusal that no retry can change (``INVALID_ARGUMENT``, ``UNAUTHENTICATED``, ...: neither
:func:`~streamrec.snapshot.is_retryable` nor :func:`~streamrec.snapshot.needs_full`) is final for
that snapshot on that replica: it is not pushed there again. When no replica took it, it is
dropped (logged) and the next snapshot is built on the last accepted version, so it carries
the dropped one's rows too; when others took it, the refusing replica is left behind.

Every snapshot carries the dense network as an exported program (``streamrec.snapshot.export_dense``), so
serving scores it without importing the model's code. The model is exported once per publisher (the graph
does not hold the weights); a full snapshot writes the program's files, a delta names the same program.
A trainer starts the export as it starts, on a thread of its own (:meth:`SnapshotPublisher.start_export`,
``trainer/program_export.py``): the export overlaps the consumer's group join and the first push interval,
and :meth:`~SnapshotPublisher.plan_next` plans no snapshot while it runs, so the poll loop never waits for it
and the first snapshot after it carries the program. A stop waits for it, bounded
(:meth:`~SnapshotPublisher.wait_export`). A publisher nobody started exports on its first snapshot, on the
caller's thread (a snapshot built by hand).
Before each snapshot is written the program, with that snapshot's weights, must give the module's logits
on the probe batch bit for bit; those logits go into the manifest, and serving checks the program against
them. A model that cannot be exported (or whose program scores differently) is logged as one error line and
its snapshots carry ``program: null``: serving then builds the module from the model config, as before.

Rows are written in ``serving.row_precision`` (fp32, fp16, int8 row-wise); each snapshot carries a row probe
(``trainer/rowprobe.py``): a few events of rows it carries and the model's scores on them from the rows as
serving will hold them, which serving checks after it loads the version.

The transport is not the trainer's: it pushes through ``pusher_factory(target)``
(:class:`streamrec.snapshot.Pusher`; the CLI passes serving's gRPC
``SnapshotPusher``), and decides what a refusal means with
:func:`streamrec.snapshot.needs_full` and :func:`streamrec.snapshot.is_retryable`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from streamrec.snapshot import Evidence, PusherFactory, empty_evidence, is_retryable, needs_full, write_snapshot

from .program_export import DenseProgram

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.snapshot.snapshot_types import RowPrecision

log = logging.getLogger(__name__)


class SnapshotForm(Protocol):
    """What a snapshot takes from the serving side's settings (``[serving]`` has both): the precision its rows
    travel in and the model line its manifest names."""

    row_precision: RowPrecision
    model_line: str

HISTORY = 1000  # built snapshots remembered in SnapshotState.history
EXPORT_CLOSE_WAIT_S = 120.0  # the most a closing publisher waits for the model's export to finish


@dataclass
class SnapshotState:
    accepted_version: int = 0  # what serving holds (0 = nothing yet)
    accepted_epoch: int = 0  # store epoch of that version (delta base)
    need_full: bool = True
    built: int = 0
    built_version: int = 0  # the newest version built (or reserved) by this publisher
    pushed: int = 0
    failures: int = 0
    last_error: str = ""
    history: list = field(default_factory=list)


class SnapshotPublisher:
    """Builds snapshot directories and pushes them with a background retry loop."""

    def __init__(self, model: ModelConfig, store: StoreConfig, serving: SnapshotForm, out_dir: str | Path, *,
                 model_hash: str, targets: Sequence[str] = (), push: bool = True, full_every: int = 10,
                 keep: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 30.0, give_up_s: float = 120.0,
                 pusher_factory: PusherFactory | None = None, version_file: str | Path | None = None):
        """``model``, ``store``: the sections each manifest records; ``serving``: the rows' precision and model
        line; ``model_hash``: ``ModelConfig.model_hash``; ``targets``: where pushes go."""
        if push and pusher_factory is None:
            raise ValueError("pushing snapshots needs a pusher_factory (e.g. SnapshotPusher.factory(serving_section))")
        self.pusher_factory = pusher_factory
        self.model_cfg, self.store_cfg, self.serving_cfg, self.model_hash = model, store, serving, model_hash
        self.out_dir = Path(out_dir)
        self.push_enabled = push
        self.full_every = max(1, full_every)
        self.keep = keep
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.st = SnapshotState()
        self._lock = threading.Lock()
        self._pending: tuple[int, int, Path] | None = None  # (version, epoch, dir)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.targets = list(targets)
        self.give_up_s = give_up_s
        self._remaining: list[str] = []  # targets that have not accepted the pending snapshot yet
        self._refused: list[str] = []  # targets that refused the pending snapshot for good (not retried)
        self._pending_since = 0.0  # monotonic time the pending snapshot was queued
        self._failing = False  # the pending snapshot's last push attempt failed somewhere (it is being retried)
        self.left_behind: list[str] = []  # replicas the newest accepted snapshot did not reach
        self._pushers: dict = {}  # target -> the Pusher pusher_factory made for it
        self.version_file = Path(version_file) if version_file else None
        self._served_floor = 0  # the newest version a replica said it serves when it refused ours as not newer
        self.program = DenseProgram(model, log)  # the dense network as an exported program
        if self.version_file is not None and self.version_file.exists():
            try:
                self.st.built_version = int(json.loads(self.version_file.read_text())["version"])
            except (OSError, ValueError, KeyError, TypeError) as e:  # a torn file: the refusal path recovers
                log.warning("%s unreadable (%s); versions continue from the checkpoint's", self.version_file, e)

    # -- state carried in checkpoints --------------------------------------
    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"accepted_version": self.st.accepted_version, "accepted_epoch": self.st.accepted_epoch,
                    "need_full": self.st.need_full, "built": self.st.built, "built_version": self.st.built_version}

    def load_state(self, d: dict[str, Any]) -> None:
        with self._lock:
            self.st.accepted_version = int(d.get("accepted_version", 0))
            self.st.accepted_epoch = int(d.get("accepted_epoch", 0))
            self.st.need_full = bool(d.get("need_full", True))
            self.st.built = int(d.get("built", 0))
            self.st.built_version = max(self.st.built_version, int(d.get("built_version", 0)),
                                        self.st.accepted_version)

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._pending is not None

    @property
    def version(self) -> int:
        with self._lock:
            return self.st.accepted_version

    def request_full(self) -> None:
        with self._lock:
            self.st.need_full = True

    @property
    def wants_full(self) -> bool:
        """Serving lost (or refused) the base of our deltas and no push is pending: a full snapshot is due
        even when nothing new was trained."""
        with self._lock:
            return self._pending is None and self.st.need_full and self.st.built > 0

    def reserve_version(self) -> int:
        """The next version, strictly above every one built before (also by an earlier process, through
        ``version_file``, fsynced before this returns) and above any a replica said it serves."""
        with self._lock:
            v = max(self.st.built_version, self.st.accepted_version, self._served_floor) + 1
            self.st.built_version = v
        if self.version_file is not None:
            self.version_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.version_file.with_name(self.version_file.name + ".tmp")
            with open(tmp, "w") as f:
                json.dump({"version": v}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.version_file)
        return v

    # -- building ------------------------------------------------------------
    def plan_next(self) -> tuple[bool, int | None, int] | None:
        """What the next snapshot will be, ``(full, parent version, rows changed after epoch)``, or None
        while a push is still pending or the model's export is running (no snapshot is built then). A trainer
        group decides this once, on rank 0, and every rank contributes its rows changed after that epoch."""
        with self._lock:
            if self._pending is not None or self.program.running:
                return None
            full = self.st.need_full or self.st.accepted_version == 0 or (self.st.built % self.full_every == 0)
            return full, (None if full else self.st.accepted_version), (0 if full else self.st.accepted_epoch)

    def publish(self, version: int, epoch: int, store, model, kafka_offsets: dict, metrics: dict,
                newest_event_ms: int, plan: tuple[bool, int | None, int] | None = None, rows=None,
                evidence: Evidence | None = None, deleted: dict | None = None) -> Path | None:
        """Build snapshot ``version`` (store state as of ``epoch``) and queue it for pushing.

        Returns the snapshot dir, or None when skipped because a push is still pending.
        ``plan`` and ``rows``: a :meth:`plan_next` taken earlier and the rows it asked for
        (a group's rows gathered from every rank); by default, decided here and read from ``store``.
        ``evidence``: the quality evidence the manifest carries (``trainer/evidence.py``); None: the caller
        observed no events for it (a publisher driven by hand), and the manifest says so (no figures).
        ``deleted``: ids per table a delta removes (evicted since its parent; ``ChangeJournal.last_deleted``).
        """
        if plan is None:
            plan = self.plan_next()
            if plan is None:
                return None
        full, parent, since = plan
        if rows is None:
            rows = store.changed_rows(since)
        import dataclasses

        out = self.out_dir / f"v{version:09d}"
        if out.exists():
            shutil.rmtree(out)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        dense_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        program, program_data = self.program.entry(model, dense_state)
        from .rowprobe import RowSample, build_row_probe

        precision = self.serving_cfg.row_precision
        sample = RowSample(rows, self.model_cfg.tables)
        write_snapshot(
            out, version=version, parent_version=parent, kind="full" if full else "delta",
            dense_state=dense_state, rows=sample, row_precision=precision,
            row_probe=lambda: build_row_probe(model, self.model_cfg, sample, precision),
            kafka_offsets={f"{t}:{p}": o for (t, p), o in kafka_offsets.items()},
            metrics={k: float(v) for k, v in metrics.items()
                     if isinstance(v, (int, float)) and v == v and abs(v) != float("inf")},
            config_hash=self.model_hash, newest_event_ms=int(newest_event_ms),
            model_config=dataclasses.asdict(self.model_cfg),
            store_config=dataclasses.asdict(self.store_cfg),
            tasks=list(self.model_cfg.task_names), program=program, program_data=program_data,
            evidence=evidence.to_block() if evidence is not None else empty_evidence(),
            model_line=self.serving_cfg.model_line,
            deleted=None if full else deleted,
        )
        with self._lock:
            self.st.built += 1
            self.st.built_version = max(self.st.built_version, int(version))
            self.st.history.append((version, "full" if full else "delta"))
            del self.st.history[:-HISTORY]  # a push a second: the recent ones are what anyone reads
            if self.push_enabled:
                self._pending = (version, epoch, out)
                self._failing = False
                self._remaining = list(self.targets)
                self._refused = []
                self._pending_since = time.monotonic()
        self._prune()
        if self.push_enabled:
            self._ensure_thread()
            self._wake.set()
        return out

    # -- the exported program (trainer/program_export.py) ---------------------
    def start_export(self, model) -> None:
        """Export ``model``'s dense network on a thread of its own from now on (a trainer calls this as it
        starts); :meth:`plan_next` plans no snapshot until it is done."""
        self.program.start(model)

    @property
    def exporting(self) -> bool:
        return self.program.running

    def wait_export(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the export :meth:`start_export` began; False (logged) while it runs."""
        return self.program.wait(timeout)

    @property
    def program_error(self) -> str:
        """Why the model has no exported program ("" = it has one, or none tried yet)."""
        return self.program.error

    def _prune(self) -> None:
        dirs = sorted(p for p in self.out_dir.glob("v*") if p.is_dir())
        with self._lock:
            pending = self._pending[2] if self._pending else None
        for p in dirs[: max(0, len(dirs) - self.keep)]:
            if p != pending:
                shutil.rmtree(p, ignore_errors=True)

    # -- pushing -------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="snapshot-push", daemon=True)
            self._thread.start()

    def _client(self, target: str):
        if target not in self._pushers:
            self._pushers[target] = self.pusher_factory(target)
        return self._pushers[target]

    def _run(self) -> None:
        delay = self.backoff_s
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                job, targets = self._pending, list(self._remaining)
            if job is None:
                continue
            version, epoch, path = job
            accepted, errors, refusals = self._push_to(targets, path)
            codes = set(refusals.values())
            with self._lock:
                self._remaining = [t for t in self._remaining if t not in accepted]
                # a refusal no retry can change: that replica does not get this snapshot
                final = [t for t in self._remaining if t in refusals and not is_retryable(refusals[t])
                         and not needs_full(refusals[t])]
                if final:
                    log.error("snapshot v%d refused for good by %s; not pushed there again", version,
                              "; ".join(e for e in errors if e.split(": ", 1)[0] in final))
                    self._refused += final
                    self._remaining = [t for t in self._remaining if t not in final]
                overdue = time.monotonic() - self._pending_since > self.give_up_s
                # a replica already left behind does not hold the others back again for give_up_s
                overdue = overdue or set(self._remaining) <= set(self.left_behind)
                self._failing = bool(self._remaining or final)
                if self._remaining or final:
                    self.st.failures += 1
                    self.st.last_error = "; ".join(errors)
                if self._remaining and any(needs_full(code) for code in codes):
                    # a replica cannot apply this delta: drop it, the next snapshot is full for all
                    self.st.need_full = True
                    self._pending = None
                    self._remaining = []
                elif not self._remaining and len(self._refused) == len(self.targets):
                    # nobody took it: drop it; the next snapshot builds on the last accepted version
                    log.error("snapshot v%d dropped: every replica refused it for good; the next one is built "
                              "on v%d", version, self.st.accepted_version)
                    self._pending = None
                    self._refused = []
                elif not self._remaining or (overdue and len(self._remaining) + len(self._refused) < len(self.targets)):
                    behind = self._remaining + self._refused
                    if set(behind) - set(self.left_behind):  # others have it: they move on
                        log.warning("snapshot v%d: leaving %s behind after %.0fs; they get a full snapshot when back",
                                    version, ", ".join(behind), self.give_up_s)
                    self.left_behind = behind
                    self.st.accepted_version, self.st.accepted_epoch = version, epoch
                    self.st.need_full = False
                    self.st.pushed += 1
                    self._pending = None
                    self._remaining = []
                    self._refused = []
            if self._pending is None:
                delay = self.backoff_s
                continue
            log.warning("snapshot v%d push failed (%s); retrying in %.1fs", version, "; ".join(errors), delay)
            if self._stop.wait(delay):
                return
            delay = min(self.max_backoff_s, delay * 2)
            self._wake.set()

    def _push_to(self, targets: list[str], path: Path) -> tuple[set[str], list[str], dict[str, str]]:
        """Push ``path`` to each target: (targets that accepted it, "target: CODE: reason" of the others,
        target -> status code of each refusal)."""
        accepted, errors, codes = set(), [], {}
        for target in targets:
            try:
                res = self._client(target).push(path)
            except Exception as e:  # network, serving down, ...: retry later with a new channel
                dead = self._pushers.pop(target, None)
                if dead is not None:
                    dead.close()
                errors.append(f"{target}: {type(e).__name__}: {e}")
                continue
            if res.ok:
                accepted.add(target)
                continue
            errors.append(f"{target}: {res.code}: {res.reason}")
            codes[target] = res.code
            if res.version > 0:  # the version it serves (a pusher may say, e.g. with "not newer than served")
                with self._lock:
                    self._served_floor = max(self._served_floor, int(res.version))
            if res.code == "UNAVAILABLE":  # a new channel next time: the old one may sit in gRPC's reconnect backoff
                self._pushers.pop(target).close()
        return accepted, errors, codes

    def wait_idle(self, timeout: float, until_failure: bool = False) -> bool:
        """Wait until no push is pending (True) or ``timeout`` passes (False). ``until_failure``: also stop
        waiting (False) once the pending push fails an attempt, at once when its last attempt failed: a stop
        must not sit out a retry schedule against a serving endpoint that does not answer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending is None:
                    return True
                if until_failure and self._failing:
                    return False
            time.sleep(0.05)
        return not self.busy

    def holds(self, version: int | None) -> bool:
        """Whether ``version`` has reached serving as far as this publisher knows: accepted (a newer accepted
        version holds its rows too); with pushes off, built."""
        if version is None:
            return False
        return self.version >= version if self.push_enabled else self.st.built_version >= version

    def unanswered(self, waited_s: float) -> str:
        """Why the newest push has no answer: its last error, or that ``waited_s`` passed without one."""
        with self._lock:
            return self.st.last_error if self._failing and self.st.last_error else f"no answer in {waited_s:.0f} s"

    def close(self) -> None:
        # the export thread runs torch's C++ code: left running into the interpreter's teardown (a run that
        # stops early, e.g. on a full disk) it aborts the process, so the close waits for it first
        self.wait_export(EXPORT_CLOSE_WAIT_S)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        # a push thread still inside a long push (past the join) may touch the dict: close a copy
        for pusher in list(self._pushers.values()):
            pusher.close()
        self._pushers.clear()
