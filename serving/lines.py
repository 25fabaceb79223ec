"""Model lines on one endpoint: each line's versions, the A/B split of Predict traffic, and shadow scoring.

A **model line** is a chain of versions pushed by one trainer (its manifest's ``model_line``, the trainer's
``serving.model_line``; a manifest without one is ``main``). Each line has its own version chain, guard
history, kept versions and rollback pin: line ``main`` is the server's own book under ``serving.data_dir``
(unchanged from a server without lines), every other line is a :class:`~.server.StreamRecService` of its own
under ``serving.data_dir/lines/<line>/``, whose state file persists that line's served version, pin and
guard history. A restart reopens every line directory it finds. A push naming a line the server has not
seen starts that line.

**Split** (``[[serving.experiments]]``): a request is routed by ``u = splitmix64(key ^ SPLIT_SALT) / 2^64``,
where ``key`` is the first event's first id of ``serving.split_field`` (a sparse field; a string id hashed as
the trainer hashes it) or its request id (``split_field = "request_id"``); the lines' shares cut ``[0, 1)``
in their config order. The same key always lands on the same line. A request without the field goes to
main. A request naming ``model_line`` is answered by that line (a line the server does not have:
INVALID_ARGUMENT; one without a model yet: UNAVAILABLE). A routed line without a model yet falls back to
main (counted in ``fallbacks``). ``PredictResponse.model_line`` names the line that answered.

**Shadow** (``serving.shadow_line``): after the answering line's scores are computed, the request goes to one
shadow worker thread, which scores the requests queued meanwhile together in one pass (up to
``serving.merge_max_events`` events, as answers are merged) with the shadow line's served version (on the
answer's decoded batch when the shadow's model has the same fields and dense width, else on the request
decoded for its own fields), and compares the first task's scores per (answering line, shadow line) pair:
mean absolute difference, share of events whose scores differ by more than ``DISAGREE``, and calibration
(mean shadow score / mean answering score). The answer never waits for the shadow: at most
``serving.shadow_max_pending`` requests wait for it, and a request arriving over that is not shadow-scored
(``shadow_skipped``). Events with a request id go to a bounded in-memory log (the newest ``SHADOW_LOG``
entries; a restart empties it), which the ``ShadowScores`` RPC hands out; ``shadow_auc`` joins it with labels
by request id (``streamrec lines --auc`` reads them from the events topic) into each side's AUC on the same
events.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from pathlib import Path

import grpc
import numpy as np

from streamrec.foundation import hash_id, roc_auc
from streamrec.snapshot import SnapshotError

from .drift import DriftWatch
from .merge import score_queued
from .offpath import OffPathWorker

log = logging.getLogger("streamrec.serving")

MAIN = "main"
DISAGREE = 0.1  # two scores of one event "disagree" when they differ by more than this
SHADOW_LOG = 100_000  # (request id, line, shadow, scores) entries kept for the AUC join, newest first out last
SPLIT_SALT = 0x5EEDAB  # mixed into the split key, so a line's users are not the ids any table's hash favours
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser on one Python int (the same function as ``foundation.splitmix64``)."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def split_point(key: int) -> float:
    """Where ``key`` falls in ``[0, 1)``: uniform over keys, the same for the same key on every process."""
    return _mix((key ^ SPLIT_SALT) & _M64) / 2.0**64


def split_key(request, field: str) -> int | None:
    """The routing key of a Predict request: the first event's first id of sparse ``field``, or its request id
    (``field == "request_id"``), as the trainer hashes ids; None when the first event has none."""
    if request.HasField("columns"):
        c = request.columns
        if field == "request_id":
            return hash_id(c.request_ids[0]) if len(c.request_ids) and c.request_ids[0] else None
        col = c.sparse.get(field) if field in c.sparse else None
        if col is None:
            return None
        if col.lengths_u32:
            first_len = int.from_bytes(col.lengths_u32[:4], "little")
        else:
            first_len = col.lengths[0] if len(col.lengths) else 0
        if not first_len:
            return None
        if col.values_i64:
            return int.from_bytes(col.values_i64[:8], "little", signed=True)
        return int(col.values[0]) if len(col.values) else None
    if not len(request.events):
        return None
    ev = request.events[0]
    if field == "request_id":
        return hash_id(ev.request_id) if ev.request_id else None
    if field not in ev.sparse:
        return None
    ids = ev.sparse[field]
    if len(ids.ids):
        return int(ids.ids[0])
    return hash_id(ids.keys[0]) if len(ids.keys) else None


class Split:
    """``[[serving.experiments]]`` as cut points over ``[0, 1)``; no experiments: every request on main."""

    def __init__(self, experiments, field: str):
        self.field = field
        self.lines = [e.line for e in experiments]
        self.cuts = np.cumsum([e.share for e in experiments]).tolist()

    def line_for_key(self, key: int | None) -> str:
        if not self.lines or key is None:
            return MAIN
        u = split_point(key)
        for name, cut in zip(self.lines, self.cuts):
            if u < cut:
                return name
        return self.lines[-1]  # rounding of the last cut

    def line_for(self, request) -> str:
        return self.line_for_key(split_key(request, self.field)) if self.lines else MAIN


@dataclasses.dataclass
class LineStats:
    """One line's answered Predict calls: requests, events, the sum of its first-task scores and latency."""

    requests: int = 0
    events: int = 0
    score_sum: float = 0.0
    seconds: float = 0.0
    fallbacks: int = 0  # requests the split routed here that main answered (the line had no model)

    @property
    def mean_score(self) -> float:
        return self.score_sum / self.events if self.events else 0.0


@dataclasses.dataclass
class ShadowPair:
    """The online comparison of one (answering line, shadow line) pair over the events both scored."""

    requests: int = 0
    events: int = 0
    abs_diff_sum: float = 0.0
    disagree: int = 0  # events whose scores differ by more than DISAGREE
    primary_sum: float = 0.0
    shadow_sum: float = 0.0

    def figures(self) -> dict:
        n = self.events
        return {"requests": self.requests, "events": n,
                "mean_abs_diff": self.abs_diff_sum / n if n else 0.0,
                "disagree_share": self.disagree / n if n else 0.0,
                "calibration": self.shadow_sum / self.primary_sum if self.primary_sum else 0.0}


def shadow_auc(entries, labels: dict) -> dict:
    """Each side's AUC over the logged events whose request id has a label: ``{(line, shadow): {"events",
    "auc_line", "auc_shadow"}}``. ``entries``: ``(request_id, line, shadow, line_score, shadow_score)``."""
    by_pair: dict = {}
    for rid, line, shadow, a, b in entries:
        if rid in labels:
            by_pair.setdefault((line, shadow), []).append((float(labels[rid]), a, b))
    out = {}
    for pair, rows in by_pair.items():
        y, a, b = (np.array(c, dtype=np.float64) for c in zip(*rows))
        y = (y > 0.5).astype(np.float64)
        out[pair] = {"events": len(rows), "auc_line": roc_auc(y, a), "auc_shadow": roc_auc(y, b)}
    return out


class ModelLines:
    """The lines of one server (see the module docstring). ``main`` is the server itself."""

    def __init__(self, main):
        self.main = main
        s = main.serving
        self.root = Path(s.data_dir) / "lines"
        self.split = Split(s.experiments, s.split_field)
        self.shadow_line = s.shadow_line
        self.max_pending = int(s.shadow_max_pending)
        self._services = {MAIN: main}
        self._lock = threading.Lock()
        self.stats: dict[str, LineStats] = {MAIN: LineStats()}
        self.pairs: dict[tuple[str, str], ShadowPair] = {}
        self.shadow_log: deque = deque(maxlen=SHADOW_LOG)
        self.shadow_skipped = 0  # requests not shadow-scored: too many waiting
        self.shadow_unserved = 0  # requests not shadow-scored: the shadow line has no model yet
        self.shadow_errors = 0  # requests the shadow could not score (its model refused them)
        self.merge_events = max(1, int(s.merge_max_events))
        # each line's candidate scored beside its promoted version on the line's answers (drift.py)
        self.drift = DriftWatch(self._services.get, main.limits, self.max_pending, self.merge_events)
        self._shadow = None  # the worker scoring answered requests with the shadow line (offpath.py)
        if self.shadow_line:
            self._shadow = OffPathWorker("shadow", self._take, self._shadow_round, self._shadow_failed,
                                         self.max_pending)
        names = {*self.split.lines, *([self.shadow_line] if self.shadow_line else [])}
        if self.root.is_dir():
            names |= {p.name for p in self.root.iterdir() if p.is_dir()}
        for name in sorted(names - {MAIN}):
            self._open(name)

    # -- the lines ---------------------------------------------------------------------------------
    def _open(self, name: str):
        from streamrec.snapshot.snapshot_types import MODEL_LINE_RE
        import re

        if not re.fullmatch(MODEL_LINE_RE, name):  # a stray directory under lines/: not a line
            log.warning("%s: not a model line name; ignored", self.root / name)
            return None
        settings = self.main.settings.with_serving(data_dir=str(self.root / name), experiments=[], shadow_line="",
                                                   model_line=name)
        svc = type(self.main)(settings, self.main.device, line=name)
        self._services[name] = svc
        self.stats.setdefault(name, LineStats())
        return svc

    @property
    def names(self) -> list[str]:
        return [MAIN, *sorted(n for n in self._services if n != MAIN)]

    def service(self, name: str, create: bool = False):
        """The service of line ``name`` (``""``: main); ``create`` starts a line a push names. An unknown line
        raises ``SnapshotError`` (NOT_FOUND)."""
        name = name or MAIN
        svc = self._services.get(name)
        if svc is None and create:
            with self._lock:
                svc = self._services.get(name) or self._open(name)
        if svc is None:
            raise SnapshotError(f"model line {name!r} is not served here (lines: {', '.join(self.names)})",
                                code="NOT_FOUND")
        return svc

    # -- Predict ------------------------------------------------------------------------------------
    def acquire(self, request, context):
        """``(line, version)`` that answers ``request`` (a reference to release), or ``(main, None)`` when
        main has no model; an explicit line the server lacks is refused here."""
        explicit = request.model_line
        if explicit:
            svc = self._services.get(explicit)
            if svc is None:
                self.main.refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                                  f"model_line: {explicit!r} is not a model line of this server "
                                  f"(lines: {', '.join(self.names)})")
            v = svc.acquire()
            if v is None and explicit != MAIN:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"model line {explicit!r} has no model yet")
            return explicit, v
        name = self.split.line_for(request)
        if name != MAIN:
            svc = self._services.get(name)
            v = svc.acquire() if svc is not None else None
            if v is not None:
                return name, v
            with self._lock:
                self.stats[name].fallbacks += 1
        return MAIN, self.main.acquire()

    def answered(self, line: str, request, scores: np.ndarray, rids, t0: float, batch=None, fields=(),
                 version: int = 0) -> None:
        """Count the answer in ``line``'s figures and hand the request to the shadow and to the line's drift
        watch (``scores``: [B, T] of ``version``; ``batch``: the request decoded for ``fields``, reused by a
        version with the same fields)."""
        first = scores[:, 0]
        if version:
            self.drift.offer(line, version, request, first, batch, fields)
        with self._lock:
            st = self.stats[line]
            st.requests += 1
            st.events += len(first)
            st.score_sum += float(first.sum())
            st.seconds += time.perf_counter() - t0
            if self._shadow is None or line == self.shadow_line:
                return
            if not self._shadow.put((line, request, first, list(rids), batch, list(fields))):
                self.shadow_skipped += 1

    def _take(self, queue: deque) -> list:
        """The shadow's round: every queued request, up to ``merge_max_events`` events, as the merger does for
        answers (a request's fixed cost is paid once per round)."""
        take, n = [], 0
        while queue and (not take or n + len(queue[0][2]) <= self.merge_events):
            take.append(queue.popleft())
            n += len(take[-1][2])
        return take

    def _shadow_failed(self, take: list, e: Exception) -> None:
        with self._lock:
            self.shadow_errors += len(take)
        log.debug("shadow line %s could not score %d requests: %s", self.shadow_line, len(take), e)

    def _shadow_round(self, take: list) -> None:
        svc = self._services.get(self.shadow_line)
        v = svc.acquire() if svc is not None else None
        if v is None:
            with self._lock:
                self.shadow_unserved += len(take)
            return
        try:
            kept, shadow_all, refused = score_queued(v, [(r, b, f) for _, r, _, _, b, f in take], self.main.limits)
        finally:
            v.release()
        at = 0
        with self._lock:
            self.shadow_errors += refused
            for line, _, primary, rids, _, _ in (take[i] for i in kept):
                shadow = shadow_all[at:at + len(primary)]
                at += len(primary)
                diff = np.abs(shadow - primary)
                p = self.pairs.setdefault((line, self.shadow_line), ShadowPair())
                p.requests += 1
                p.events += len(diff)
                p.abs_diff_sum += float(diff.sum())
                p.disagree += int((diff > DISAGREE).sum())
                p.primary_sum += float(primary.sum())
                p.shadow_sum += float(shadow.sum())
                if rids:
                    self.shadow_log.extend((rid, line, self.shadow_line, a, b)
                                           for rid, a, b in zip(rids, primary.tolist(), shadow.tolist()) if rid)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until no request waits for its shadow scoring or the drift watch (tests, benchmarks); False on
        timeout."""
        deadline = time.monotonic() + timeout
        shadow = self._shadow.drain(timeout) if self._shadow is not None else True
        return self.drift.drain(max(0.0, deadline - time.monotonic())) and shadow

    # -- reading ------------------------------------------------------------------------------------
    def figures(self) -> dict:
        """Per line and per shadow pair, for Status, /metrics and the report."""
        with self._lock:
            lines = {n: dataclasses.asdict(s) | {"mean_score": s.mean_score,
                                                  "mean_latency_s": s.seconds / s.requests if s.requests else 0.0}
                     for n, s in self.stats.items()}
            pairs = {f"{a}/{b}": p.figures() for (a, b), p in self.pairs.items()}
            return {"lines": lines, "shadow": pairs, "shadow_skipped": self.shadow_skipped,
                    "shadow_unserved": self.shadow_unserved, "shadow_errors": self.shadow_errors}

    def status(self, resp, pb) -> None:
        """``StatusResponse.lines``: every line's served version, head, pin, hold and answered figures."""
        figs = self.figures()
        for name in self.names:
            svc = self._services[name]
            ls = resp.lines.add()
            ls.model_line = name
            st = pb.StatusResponse()
            v = svc.current
            svc.book.status(st, v)
            ls.version = v.version if v is not None else 0
            ls.newest_version = st.newest_version
            ls.pinned = st.pinned
            ls.held_reason = st.held_reason
            ls.versions_held = st.versions_held
            ls.kept_versions.extend(st.kept_versions)
            if st.HasField("drift"):
                ls.drift.CopyFrom(st.drift)
            f = figs["lines"].get(name, {})
            ls.requests = int(f.get("requests", 0))
            ls.mean_score = float(f.get("mean_score", 0.0))
            ls.fallbacks = int(f.get("fallbacks", 0))
            share = dict(zip(self.split.lines, np.diff([0.0, *self.split.cuts]).tolist()))
            ls.share = float(share.get(name, 1.0 if not self.split.lines and name == MAIN else 0.0))
            ls.shadow = name == self.shadow_line
        for pair, f in figs["shadow"].items():
            sp = resp.shadow.add()
            sp.model_line, sp.shadow_line = pair.split("/")
            sp.events = f["events"]
            sp.mean_abs_diff = f["mean_abs_diff"]
            sp.disagree_share = f["disagree_share"]
            sp.calibration = f["calibration"]

    def close(self) -> None:
        self.drift.close()
        if self._shadow is not None:
            self._shadow.close()
        for name, svc in list(self._services.items()):
            if name != MAIN:
                svc.close()
