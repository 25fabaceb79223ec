"""The gRPC server: Predict, PushSnapshot (verified, then one-step swap), Status,
plus the standard ``grpc.health.v1`` service and server reflection (v1 and v1alpha).

Pushes are serialised; Predict never waits for a push: it takes a reference to
the current version (see ``version.py``) and scores with it to the end.

Hostile and careless clients (every limit is a ``serving.*`` key, named in the refusal):

- Every call runs in a lane with its own threads and a cap on calls held at once
  (``admission.py``): Predict (``workers`` threads, ``max_concurrent_requests``), pushes,
  long-lived streams (health Watch, reflection), and Status/health checks. A full lane refuses
  at once with RESOURCE_EXHAUSTED; a flood of one kind never takes another's threads.
- Predict and PushSnapshot take their request bytes raw: size (``max_request_kb``) is checked
  before parsing, and bytes that are not the message are INVALID_ARGUMENT (gRPC's own decoding
  answers INTERNAL). Events, ids per event and per request are counted before ids are copied,
  hashed or looked up; dense values must be finite and within ``ingest.dense_abs_max``.
- A heavy request (more ids + events than ``heavy_request_cost``) is scored apart from the
  merged rounds of ordinary requests (it would hold back every request merged with it), one at
  a time (``max_concurrent_heavy`` admitted) on one worker thread of low OS priority
  (``HEAVY_NICE``), in slices of ``HEAVY_SLICE_IDS`` ids; before each slice, while ordinary
  requests are in progress, the heavy lane rests as long as its last slice ran (``HEAVY_REST``):
  at most about half the time, and an ordinary request waits for one slice.
- BDP probing is off (``TRANSPORT_OPTIONS``): a message over ``max_message_mb`` is refused after
  one 64 KiB flow-control window, not after the client has pushed all of it.
- A client address refused more often than ``TARPIT_AFTER`` times a second (past a burst of as
  many) gets its further refusals ``refusal_delay_ms`` late (``refusals.py``): a flood of bad
  calls slows to the pace of the delay.
- A score is never NaN: a request whose scores are not finite is refused, naming the event.
- Pushes: the manifest's shape, names, sizes and model dimensions are checked before a byte
  of the snapshot is stored or a tensor allocated; every tensor must be finite; a version must
  be newer than the served one and at most ``max_version_jump`` ahead.
- Start-up refuses an empty push token on a non-loopback address (``push_exposure``) unless
  the operator asks for it (``streamrec serve --insecure-push``), and then warns on every start.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import shutil
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from streamrec.foundation import ConfigError, is_resource_error, resolve_device
from streamrec.serving.serving_config import ServingConfig
from streamrec.snapshot import SnapshotError
from streamrec.snapshot.format import MAX_VERSION

from .admission import Lanes
from .convert import Limits, RequestError, request_cost, request_to_batch_ids
from .merge import RequestMerger
from .pb import SERVICE, pb, pb_grpc
from .receiver import parse_chunks, receive_snapshot
from .reflection import V1_SERVICE, V1ALPHA_SERVICE, enable_reflection
from .refusals import Refusals
from .settings import ServerSettings
from .history import VersionBook
from .lines import MAIN, ModelLines
from .operator import operator_handlers
from .version import ServedVersion, StoredVersionDamaged, check_model_config, load_version

log = logging.getLogger("streamrec.serving")

# lanes besides Predict's: (threads, calls held at once); their refusals name these numbers
PUSH_LANE = (2, 4)  # pushes are installed one at a time anyway
STREAM_LANE = (4, 4)  # health Watch and reflection streams: long-lived, need no token
CONTROL_LANE = (2, 64)  # Status, health Check: quick
# HTTP/2 flow control: with BDP probing on (gRPC's default) the server widens every stream's receive
# window to what the link carries, so a client can push a whole over-limit message before gRPC refuses
# it. Off, a stream's window stays at HTTP/2's 64 KiB: gRPC reads the 5-byte length prefix, refuses the
# message (RESOURCE_EXHAUSTED) and resets the stream after about one window, whatever the message's
# size. The cost: a legal request bigger than 64 KiB needs a window update per 64 KiB, one round trip
# each; a batch-512 request fits in one window. See BENCHMARKS.md, serve.
TRANSPORT_OPTIONS = (("grpc.http2.bdp_probe", 0),)
HEAVY_REST = 1.0  # while ordinary requests are in progress, the heavy lane rests as long as its last slice ran
HEAVY_SLICE_IDS = 2048  # a heavy request is scored in slices of about this many ids (whole events), yielding between
HEAVY_NICE = 19  # the heavy worker thread's OS priority (Linux nice, per thread): ordinary requests' threads run first


def lower_priority(nice: int) -> None:
    """Lower the calling thread's OS priority to ``nice`` (Linux, where nice is per thread). Lowering needs no
    privilege; elsewhere, or if refused, the thread keeps its priority (logged once)."""
    if not sys.platform.startswith("linux") or nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError as e:
        log.info("heavy worker keeps its OS priority (%s)", e)


def heavy_slices(batch, ids_per_slice: int) -> list[tuple[int, int]]:
    """Event ranges ``[a, b)`` covering ``batch`` in order, each at most ``ids_per_slice`` ids + events, filled
    greedily; an event is never split, so an event bigger than that is a slice of its own."""
    n = len(batch)
    cost = np.ones(n, dtype=np.int64)
    for j in batch.sparse.values():
        cost += j.lengths
    out, start, held = [], 0, 0
    for i, c in enumerate(cost.tolist()):
        if held and held + c > ids_per_slice:
            out.append((start, i))
            start, held = i, 0
        held += c
    out.append((start, n))
    return out


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a host name or an interface name: reachable from elsewhere, as far as we know


def push_exposure(s: ServingConfig) -> str | None:
    """Why a server with serving section ``s`` would let anyone on the network replace the model, or None."""
    if s.push_token or is_loopback(s.host):
        return None
    return (f"serving.push_token is empty and serving.host is {s.host!r} (not loopback): anyone who can reach "
            f"port {s.port} could replace the served model")


def startup_warnings(s: ServingConfig, insecure_push: bool) -> list[str]:
    """What a start with serving section ``s`` warns about on every start; raises ``ConfigError`` when the push
    endpoint would be open to the network (:func:`push_exposure`) and ``insecure_push`` does not accept that."""
    exposure = push_exposure(s)
    if exposure and not insecure_push:
        raise ConfigError(f"{exposure}. Set serving.push_token (STREAMREC_SERVING__PUSH_TOKEN), bind "
                          "serving.host to 127.0.0.1, or start with --insecure-push to accept this")
    warnings = [f"INSECURE: {exposure} (--insecure-push)"] if exposure else []
    if not s.tls_cert and not is_loopback(s.host) and (s.push_token or s.predict_token):
        warnings.append(f"serving.host is {s.host!r} without TLS: bearer tokens cross the network in "
                        "plaintext (set serving.tls_cert and serving.tls_key)")
    return warnings


def _authorized(context, token: str) -> bool:
    if not token:
        return True
    want = f"Bearer {token}".encode()
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            return hmac.compare_digest(str(v).encode(), want)
    return False


def verify_parent(service, parent: ServedVersion) -> None:
    """Before a delta is applied on ``parent``: its stored files as recorded at install. A damaged parent
    is taken out of service at once (Predict answers UNAVAILABLE, health NOT_SERVING, Status says why)
    and the delta is refused with DATA_LOSS naming the file, so the trainer sends a full snapshot."""
    try:
        n, seconds = parent.verify()
    except StoredVersionDamaged as e:
        reason = f"stored version {e.version} is damaged: {e}; not serving until a full snapshot is pushed"
        log.error("NOT_SERVING: %s", reason)
        if service.withdraw(parent, reason):
            set_health(service.health, health_pb2.HealthCheckResponse.NOT_SERVING)
            parent.retire(keep_dir=True)  # left on disk for the operator; a restart skips it (damaged)
        service.book.forget(parent)
        raise SnapshotError(f"parent_version: {reason}", code="DATA_LOSS") from None
    service.count_verify("delta", n, seconds)


def set_health(health_servicer, status) -> None:
    """``status`` for the whole server and for the StreamRec service (None: no health service)."""
    if health_servicer is not None:
        health_servicer.set("", status)
        health_servicer.set(SERVICE, status)


class StreamRecService(pb_grpc.StreamRecServicer):
    """The three RPCs. Predict, PushSnapshot and Status take their request bytes raw (see ``handler``)."""

    def __init__(self, settings: ServerSettings, device: torch.device, health_servicer=None, siblings=None,
                 line: str = MAIN):
        self.settings = settings
        self.serving = settings.serving  # this service's section (a model line's own, see lines.py)
        self.line = line  # the model line this service holds (lines.py); main's service routes the others
        self.device = device
        self.health = health_servicer
        self.siblings = siblings  # the other processes of a serving group (siblings.py), or None
        s = settings.serving
        self.limits = Limits.from_serving(s, settings.dense_abs_max)
        self._heavy_slots = threading.BoundedSemaphore(s.max_concurrent_heavy)
        # heavy requests' work: one thread, at a lower OS priority (see _score_heavy)
        self._heavy_worker = futures.ThreadPoolExecutor(1, thread_name_prefix="heavy", initializer=lower_priority,
                                                        initargs=(HEAVY_NICE,))
        self._heavy_last_s = 0.0  # how long the heavy lane's last slice ran
        self.heavy_slices = 0  # heavy-request slices scored (tests, benchmarks)
        self._light_active = 0  # ordinary Predict calls being decoded or scored
        self.refusals = Refusals(s, s.workers // 2)  # at most half the Predict threads wait in a late refusal
        root = Path(s.data_dir)
        self.staging = root / "staging"
        self.versions = root / "versions"
        shutil.rmtree(self.staging, ignore_errors=True)  # leftovers of a crashed receive
        self.staging.mkdir(parents=True, exist_ok=True)
        self.versions.mkdir(parents=True, exist_ok=True)
        self._current: ServedVersion | None = None
        self._closed = False
        self._swap_lock = threading.Lock()
        self._push_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._light_idle = threading.Condition(self._count_lock)  # notified when no ordinary Predict is in progress
        self.requests_served = 0
        self.swaps = 0  # versions swapped in (Prometheus streamrec_serving_swaps_total)
        self.events_served = 0
        self.max_snapshot_bytes = int(s.max_snapshot_mb) * 1024**2
        self.merger = RequestMerger(lambda v, b: v.predict(b), lambda v: v.fields, lambda v: v.dense_dim,
                                    s.merge_max_events)
        # stored versions checked against their install record (version.py): counted, timed, and why none is served
        self.stored_refused = 0  # stored versions found damaged (at start or before a delta on them)
        self.verify_bytes, self.verify_s = 0, 0.0  # bytes hashed verifying stored versions, and the seconds it took
        self.last_verify: dict = {}  # the last verification: {"when": "start"|"delta", "bytes", "seconds"}
        self.not_serving_reason = ""  # set while nothing is served because stored versions failed their checks
        skipped: list = []
        # the head, the kept and the served version, and the guard (history.py); a restart serves what it
        # served before, pinned or not
        self.book = VersionBook(root, s, settings.store, on_settle=lambda: serve_settled(self))
        restored = self.book.restore(device, skipped)
        self.stored_refused += sum(isinstance(e, StoredVersionDamaged) for _, e in skipped)
        if restored is not None:
            if restored.verified is not None:
                self.count_verify("start", *restored.verified)
            self.swap_in(restored)
        elif skipped:
            self.not_serving_reason = ("no stored version verifies (" + "; ".join(f"version {n}: {e}" for n, e in skipped)
                                       + "); not serving until a full snapshot is pushed")
            log.error("NOT_SERVING: %s", self.not_serving_reason)
        self.lines = ModelLines(self) if line == MAIN else None  # the other model lines, the split, the shadow

    # -- versions -------------------------------------------------------
    @property
    def current(self) -> ServedVersion | None:
        return self._current

    def acquire(self) -> ServedVersion | None:
        """A reference on the served version (to release), or None while nothing is served."""
        while True:
            v = self._current
            if v is None or v.acquire():
                return v
            # retired and closed between the read and acquire: the new one is in place, retry

    def count_verify(self, when: str, n_bytes: int, seconds: float) -> None:
        """Count a check of a stored version against its record (at ``when``: "start" or "delta")."""
        with self._count_lock:
            self.verify_bytes += n_bytes
            self.verify_s += seconds
            self.last_verify = {"when": when, "bytes": n_bytes, "seconds": seconds}

    def withdraw(self, damaged: ServedVersion, reason: str) -> bool:
        """Count ``damaged`` (a stored version that failed its check) and stop serving it, saying ``reason``,
        when it is the served one; True when it was."""
        with self._count_lock:
            self.stored_refused += 1
        with self._swap_lock:
            taken = self._current is damaged
            if taken:
                self._current = None
                self.not_serving_reason = reason
        return taken

    def swap_in(self, new: ServedVersion) -> None:
        """Serve ``new`` from the next request on (one reference assignment); the book then retires what it no
        longer keeps."""
        with self._swap_lock:
            closed = self._closed
            if not closed:
                self._current = new
                self.swaps += 1
                self.not_serving_reason = ""
        if closed:  # an install that outlived close(): never current; its complete directory is kept for the next start
            new.retire(keep_dir=True)
            raise SnapshotError(f"server is shutting down; version {new.version} is kept for the next start", code="UNAVAILABLE")
        set_health(self.health, health_pb2.HealthCheckResponse.SERVING)
        self.book.settle(new)  # the old one stays loaded while kept for a rollback

    def install(self, staged: Path, manifest) -> ServedVersion:
        """Load a verified snapshot directory and swap it in (used by PushSnapshot and tests)."""
        if manifest.model_line != self.line:  # another line's version: that line's chain, guard and book
            return self.lines.service(manifest.model_line, create=True).install(staged, manifest)
        with self._push_lock:
            if self._closed:
                raise SnapshotError("server is shutting down", code="UNAVAILABLE")
            self.precheck(manifest)
            # a reference on the parent while loading: close() may retire it meanwhile, and a delta
            # copies its store (it was closed under the load, or the load failed)
            parent = self.book.acquire_head(lambda: self._current)  # a delta builds on the newest installed one
            try:
                if manifest.kind == "delta" and parent is not None and parent.version == manifest.parent_version:
                    verify_parent(self, parent)
                v = load_version(staged, manifest, parent, self.versions, self.serving, self.settings.store,
                                 self.device)
            finally:
                if parent is not None:
                    parent.release()
            with self.book.lock:  # the guard decides whether users get it (history.py)
                verdict = self.book.add(v, self._current)
                self.swap_in(v) if verdict.ok else self.book.settle(self._current)
            if verdict.ok:
                log.info("serving version %d (%s, parent %s, %d rows)", v.version, manifest.kind,
                         manifest.parent_version, v.rows_held)
            return v

    def install_from(self, path) -> str | None:
        """``streamrec serve --snapshot DIR``: verify ``DIR`` (a missing or corrupt one raises ``SnapshotError``),
        then install it. Returns why it was not installed (e.g. a restart already serves this version or a newer
        one), None when it was."""
        from streamrec.snapshot import verify_snapshot

        manifest = verify_snapshot(path)
        try:
            self.install(Path(path), manifest)
        except SnapshotError as e:
            return str(e)
        return None

    def precheck(self, manifest) -> None:
        """What can be decided from the manifest alone, before a byte of the snapshot is stored."""
        if manifest.model_line != self.line:
            return self.lines.service(manifest.model_line, create=True).precheck(manifest)
        self.book.precheck(manifest)
        cur = self.book.head or self._current  # versions and deltas follow the newest installed one
        if cur is not None and manifest.version <= cur.version:
            raise SnapshotError(f"version {manifest.version} is not newer than the served {cur.version}", code="FAILED_PRECONDITION")
        jump = self.serving.max_version_jump
        if cur is not None and manifest.version > cur.version + jump:
            raise SnapshotError(f"version {manifest.version} is more than serving.max_version_jump ({jump}) ahead of "
                                f"the served {cur.version}", code="INVALID_ARGUMENT")
        if manifest.version > MAX_VERSION:  # Manifest.check refuses it too; here for manifests built in-process
            raise SnapshotError(f"version {manifest.version} is above 2^62", code="INVALID_ARGUMENT")
        check_model_config(manifest.model_config, self.serving, program=manifest.program is not None)
        if manifest.kind == "delta" and (cur is None or cur.version != manifest.parent_version):
            have = "none" if cur is None else cur.version
            raise SnapshotError(f"parent_version: delta needs parent {manifest.parent_version}, serving {have}; send a full snapshot", code="FAILED_PRECONDITION")

    def close(self) -> None:
        """Stop serving; the current version's directory stays for the next start to restore."""
        self._heavy_worker.shutdown(wait=False)
        with self._swap_lock:
            self._closed = True  # a push still loading is not swapped in after this (see swap_in)
            self._current = None
        self.book.close()
        if self.lines is not None:
            self.lines.close()

    # -- RPCs -----------------------------------------------------------
    authorized = staticmethod(_authorized)  # the bearer-token check, for the operator RPCs (operator.py)

    def handler(self) -> grpc.GenericRpcHandler:
        """The service with raw request bytes: each RPC parses (and bounds) its own request."""
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Predict": grpc.unary_unary_rpc_method_handler(
                self.Predict, response_serializer=pb.PredictResponse.SerializeToString),
            "PushSnapshot": grpc.stream_unary_rpc_method_handler(
                self.PushSnapshot, response_serializer=pb.PushResponse.SerializeToString),
            "Status": grpc.unary_unary_rpc_method_handler(
                self.Status, response_serializer=pb.StatusResponse.SerializeToString),
            **operator_handlers(self),
        })

    @property
    def refused(self) -> dict[str, int]:
        """Predict refusals by status code name (tests, benchmarks)."""
        return self.refusals.refused

    @property
    def delayed(self) -> int:
        """Predict refusals answered late (a flooding client address, see refusals.py)."""
        return self.refusals.delayed

    def refuse(self, context, code: grpc.StatusCode, details: str):
        """Refuse a Predict call (``refusals.py``: counted, late for a flooding client address)."""
        self.refusals.refuse(context, code, details)

    def _parse_predict(self, request, context):
        if not isinstance(request, (bytes, bytearray, memoryview)):
            return request  # already a message (called in-process)
        limit = int(self.serving.max_request_kb) * 1024
        if len(request) > limit:
            self.refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"request: {len(request)} bytes, serving.max_request_kb allows {limit} "
                         f"({self.serving.max_request_kb} KiB); send fewer events per request")
        try:
            return pb.PredictRequest.FromString(bytes(request))
        except Exception:  # DecodeError, or whatever the protobuf runtime raises on garbage
            self.refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "request: the bytes are not a streamrec.v1.PredictRequest (malformed protobuf)")

    def _decode(self, request, v: ServedVersion, context):
        try:
            return request_to_batch_ids(request, v.fields, v.dense_dim, self.limits)
        except RequestError as e:
            self.refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _heavy_turn(self) -> None:
        """Wait while ordinary requests are in progress, at most ``HEAVY_REST`` times as long as the heavy
        lane's last step ran."""
        with self._light_idle:
            deadline = time.monotonic() + HEAVY_REST * self._heavy_last_s
            while self._light_active and (left := deadline - time.monotonic()) > 0:
                self._light_idle.wait(left)

    def _heavy_steps(self, v: ServedVersion, request) -> tuple[np.ndarray, list]:
        """A heavy request's work, on the heavy worker thread: decoded, then scored in slices of about
        ``HEAVY_SLICE_IDS`` ids, each like a light request; before each step the lane yields to ordinary
        requests (``_heavy_turn``). Raises ``RequestError`` for a request the decoding refuses."""
        parts = []
        t0 = time.monotonic()
        try:
            self._heavy_turn()
            t0 = time.monotonic()
            batch, rids = request_to_batch_ids(request, v.fields, v.dense_dim, self.limits)
        finally:
            self._heavy_last_s = time.monotonic() - t0
        for a, b in heavy_slices(batch, HEAVY_SLICE_IDS):
            self._heavy_turn()
            t0 = time.monotonic()
            try:
                parts.append(v.predict(batch if (a, b) == (0, len(batch)) else batch.take(np.arange(a, b))))
            finally:
                self._heavy_last_s = time.monotonic() - t0
                self.heavy_slices += 1
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]), rids

    def _score_heavy(self, v: ServedVersion, request, context) -> tuple[np.ndarray, list]:
        """A heavy request's scores, computed on the one heavy worker thread (so heavy requests run one at a
        time), which runs at a lower OS priority (``HEAVY_NICE``). Why both: slices bound how long an
        ordinary request arriving meanwhile waits (one slice, not the whole heavy request), and the lower
        priority lets the OS run the threads that receive, dispatch and answer ordinary requests first
        when the heavy thread competes with them for the cores (BENCHMARKS.md, serve). The known risk:
        the low-priority thread descheduled while it holds the GIL, which the others then wait for."""
        try:
            job = self._heavy_worker.submit(self._heavy_steps, v, request)
        except RuntimeError:  # the worker was shut down: the server is closing
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            return job.result()
        except RequestError as e:
            self.refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def Predict(self, request, context):
        s = self.serving
        if not _authorized(context, s.predict_token):
            self.refuse(context, grpc.StatusCode.UNAUTHENTICATED, "Predict needs metadata 'authorization: Bearer <token>'")
        size = len(request) if isinstance(request, (bytes, bytearray, memoryview)) else None
        request = self._parse_predict(request, context)
        t0 = time.perf_counter()
        line, v = self.lines.acquire(request, context)  # the line that answers: split or named (lines.py)
        if v is None:
            why = self.not_serving_reason
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not serving: {why}" if why else
                          "no model loaded yet; push a snapshot first")
        try:
            cost, batch = 0, None
            # every id takes at least a byte on the wire: a request of few bytes cannot be heavy (and the
            # decoding enforces every count limit before it copies ids); others are counted first
            n = request.columns.size if request.HasField("columns") else len(request.events)
            if s.heavy_request_cost and (size is None or n + size > s.heavy_request_cost):
                try:
                    cost = request_cost(request, v.fields, self.limits)  # counts only: before any real work
                except RequestError as e:
                    self.refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
            if s.heavy_request_cost and cost > s.heavy_request_cost:
                # decoded and scored apart from the merged rounds (it would hold back every request merged
                # with it), one at a time
                if not self._heavy_slots.acquire(blocking=False):
                    self.refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"request: {cost} ids + events is heavy (serving.heavy_request_cost "
                                 f"{s.heavy_request_cost}) and serving.max_concurrent_heavy ({s.max_concurrent_heavy}) "
                                 "heavy requests are in progress; retry later or send smaller requests")
                try:
                    scores, rids = self._score_heavy(v, request, context)
                finally:
                    self._heavy_slots.release()
            else:
                with self._count_lock:
                    self._light_active += 1
                try:
                    batch, rids = self._decode(request, v, context)
                    scores = self.merger.score(v, batch)  # with requests that queued meanwhile, on the same version
                finally:
                    with self._count_lock:
                        self._light_active -= 1
                        if not self._light_active:
                            self._light_idle.notify_all()
            version, tasks, fields = v.version, v.tasks, v.fields
        finally:
            v.release()
        if scores.ndim == 1:
            scores = scores[:, None]
        finite = np.isfinite(scores).all(axis=1)
        if not finite.all():  # the weights are finite (checked on push): extreme features overflowed the model
            i = int(np.argmin(finite))
            log.warning("Predict: score of event %d is not finite (version %d); refused", i, version)
            self.refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"events[{i}]: the served model's score for this event is not a number (its features "
                         "overflow the model); normalise the dense features")
        with self._count_lock:
            self.requests_served += 1
            self.events_served += len(scores)
        self.lines.answered(line, request, scores, rids, t0, batch, fields, version)  # per-line figures; the shadow, after
        resp = pb.PredictResponse(model_version=version, model_line=line)
        resp.scores.extend(scores[:, 0].tolist())  # the first task: what single-task clients read
        for t, name in enumerate(tasks):
            ts = resp.task_scores.add()
            ts.task = name
            ts.scores.extend(scores[:, t].tolist())
        if rids:
            resp.request_ids.extend(rids)
        return resp

    def PushSnapshot(self, request_iterator, context):
        if not _authorized(context, self.serving.push_token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "PushSnapshot needs metadata 'authorization: Bearer <token>'")
        try:
            chunks = parse_chunks(request_iterator)
            staged, manifest = receive_snapshot(chunks, self.staging, self.max_snapshot_bytes, self.precheck)
            t0 = time.perf_counter()
            # a serving group: the verified snapshot goes to the other processes meanwhile (not when a sibling sent it)
            fan = self.siblings is not None and not self.siblings.is_sibling_call(context)
            jobs = self.siblings.start_forward(staged) if fan else []
            try:
                try:
                    v = self.install(staged, manifest)
                finally:
                    futures.wait(jobs)  # the forwards read the staged files until they are answered
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            answers = self.siblings.verdict(jobs, manifest.version) if fan else []  # raises for a sibling's refusal
            if answers:
                log.info("version %d forwarded to %d of %d sibling processes", v.version,
                         sum(a.ok for a in answers), len(answers))
            self.refusals.push_installed()
            return pb.PushResponse(accepted=True, version=v.version, load_seconds=time.perf_counter() - t0)
        except SnapshotError as e:
            cur = self._current
            log.warning("refused snapshot: %s %s (still serving %s)", e.code, e, cur.version if cur else None)
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        except Exception as e:
            if is_resource_error(e):  # this machine, not the snapshot: disk full, read-only, no file handles
                cur = self._current
                self.refusals.refuse_push_for_resources(e, context, cur.version if cur else None, self.staging)
            if isinstance(e, OSError):
                log.error("push failed on the server: %s", e)
                context.abort(grpc.StatusCode.INTERNAL, f"server: {e}")
            log.exception("push failed on the server")  # a server fault, not a verdict on the snapshot: INTERNAL
            context.abort(grpc.StatusCode.INTERNAL, f"server fault: {type(e).__name__}: {str(e)[:300]}")

    def Status(self, request, context):
        s = self.serving
        if s.status_needs_token and not _authorized(context, s.predict_token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Status needs metadata 'authorization: Bearer <token>' "
                                                           "(serving.status_needs_token)")
        if isinstance(request, (bytes, bytearray, memoryview)):
            try:
                pb.StatusRequest.FromString(bytes(request))
            except Exception:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: the bytes are not a streamrec.v1.StatusRequest")
        v = self._current
        resp = pb.StatusResponse(requests_served=self.requests_served, events_served=self.events_served,
                                 process=self.siblings.index if self.siblings is not None else 0,
                                 processes=self.serving.processes if self.siblings is not None else 1)
        if v is None:
            resp.not_serving_reason = self.not_serving_reason
        else:
            version_status(resp, v)
        self.book.status(resp, v)
        self.lines.status(resp, pb)
        return resp


def serve_settled(service: StreamRecService) -> None:
    """Serve the head when the book's settle rule promotes it (history.py): the book's timer asks."""
    with service.book.lock:
        v = service.book.promote_settled(service.current)
        if v is not None:
            service.swap_in(v)


def version_status(resp, v: ServedVersion) -> None:
    """Fill a ``StatusResponse`` with the served version ``v``: its manifest's identity, freshness and metrics."""
    m = v.manifest
    now_ms = time.time() * 1000
    resp.serving = True
    resp.version = v.version
    resp.parent_version = m.parent_version or 0
    resp.kind = m.kind
    resp.created_ms = m.created_ms
    resp.newest_event_ms = m.newest_event_ms
    resp.freshness_s = max(0.0, (now_ms - m.newest_event_ms) / 1000.0) if m.newest_event_ms else 0.0
    resp.rows_held = v.rows_held
    resp.config_hash = m.config_hash
    resp.loaded_ms = v.loaded_ms
    resp.tasks.extend(v.tasks)
    resp.exported_program = v.program is not None
    for k, x in m.metrics.items():
        resp.metrics[k] = float(x)


class ServingServer:
    """A running server: ``.port``, ``.service`` (current version, counters), ``.stop()``.

    Limits, set explicitly: ``serving.max_message_mb`` caps every gRPC message in
    both directions (``grpc.max_receive/send_message_length``); a bigger message is
    refused by gRPC itself with ``RESOURCE_EXHAUSTED`` before it reaches Python.
    A Predict request is bounded by ``max_request_kb`` (bytes, before parsing),
    ``max_batch`` (events), ``max_ids_per_event`` and ``max_ids_per_request``;
    calls held at once by the lanes (``admission.py``). Snapshots stream in chunks,
    so their size is bounded by ``serving.max_snapshot_mb`` rather than the message
    limit. On start it serves the newest complete version left in ``serving.data_dir``
    (see ``version.restore_newest``).

    ``insecure_push``: start even when :func:`push_exposure` finds the push endpoint open
    to the network (``streamrec serve --insecure-push``); it is logged as a warning.
    """

    def __init__(self, settings: ServerSettings, device: torch.device | str | None = None, port: int | None = None,
                 insecure_push: bool = False, siblings=None):
        self.settings = settings
        s = settings.serving
        self.warnings = startup_warnings(s, insecure_push)
        self.device = resolve_device(device or "auto") if not isinstance(device, torch.device) else device
        limit = int(s.max_message_mb) * 1024 * 1024
        self.health = health.HealthServicer()
        set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.service = StreamRecService(settings, self.device, self.health, siblings)
        reflection_names = (V1_SERVICE, V1ALPHA_SERVICE)
        lanes = {
            "predict": (s.workers, s.max_concurrent_requests,
                        f"serving.max_concurrent_requests ({s.max_concurrent_requests}) Predict calls are in "
                        "progress; retry later"),
            "push": (*PUSH_LANE, f"{PUSH_LANE[1]} PushSnapshot calls are in progress; retry later"),
            "streams": (*STREAM_LANE, f"{STREAM_LANE[1]} health Watch / reflection streams are open; retry later"),
            "control": (*CONTROL_LANE, f"{CONTROL_LANE[1]} Status / health Check calls are in progress; retry later"),
        }

        def route(method: str) -> str:
            svc, _, name = method.strip("/").partition("/")
            if svc == SERVICE:
                return {"Predict": "predict", "PushSnapshot": "push"}.get(name, "control")
            if svc in reflection_names or (svc == health.SERVICE_NAME and name == "Watch"):
                return "streams"
            return "control"

        self.lanes = Lanes(lanes, route)
        self.metrics = None  # Prometheus, outside the lanes: a call a full lane refuses is counted too
        if s.metrics_port:
            from .metrics import ServingMetrics

            self.metrics = ServingMetrics(self.service, s.metrics_port, s.metrics_host)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="serving"),  # every method has its lane
            interceptors=(self.metrics, self.lanes) if self.metrics is not None else (self.lanes,),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     # a serving group's processes share the port; a lone server must not share it by accident
                     ("grpc.so_reuseport", 1 if siblings is not None else 0), *TRANSPORT_OPTIONS],
            maximum_concurrent_rpcs=2 * self.lanes.capacity,  # a backstop: the lanes refuse long before
        )
        self.server.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if s.reflection:
            enable_reflection((pb.DESCRIPTOR.services_by_name["StreamRec"].full_name, health.SERVICE_NAME), self.server)
        addr = f"{s.host}:{s.port if port is None else port}"
        if s.tls_cert:
            creds = grpc.ssl_server_credentials([(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())])
            self.port = self.server.add_secure_port(addr, creds)
        else:
            self.port = self.server.add_insecure_port(addr)
        if not self.port:
            raise OSError(f"cannot listen on {addr}")
        self.private_port = 0  # a serving group's process: where its siblings forward pushes (loopback only)
        if siblings is not None:
            self.private_port = self.server.add_insecure_port("127.0.0.1:0")
            if not self.private_port:
                raise OSError("cannot listen on 127.0.0.1 for the serving group's forwarded pushes")
        self.host = s.host
        self.tls = bool(s.tls_cert)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "ServingServer":
        self.server.start()
        if self.metrics is not None:
            self.metrics.start()
        for w in self.warnings:
            log.warning("%s", w)
        log.info("serving on %s (%s, device %s)", self.target, "TLS" if self.tls else "plaintext", self.device)
        return self

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()  # health checks say NOT_SERVING from here on
        self.server.stop(grace).wait(grace + 5)
        self.service.close()
        if self.service.siblings is not None:
            self.service.siblings.close()
        self.lanes.shutdown()
        if self.metrics is not None:
            self.metrics.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)

    def __enter__(self) -> "ServingServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(0.5)
