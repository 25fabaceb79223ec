"""The gRPC server: Predict, PushSnapshot (verified, then one-step swap), Status,
plus the standard ``grpc.health.v1`` service and server reflection.

Pushes are serialised; Predict never waits for a push: it takes a reference to
the current version (see ``version.py``) and scores with it to the end.
"""

from __future__ import annotations

import hmac
import logging
import shutil
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from streamrec.foundation import Config, resolve_device
from streamrec.snapshot import SnapshotError

from .convert import RequestError, request_to_batch_ids
from .merge import RequestMerger
from .pb import SERVICE, pb, pb_grpc
from .receiver import receive_snapshot
from .version import ServedVersion, load_version, restore_newest

log = logging.getLogger("streamrec.serving")


def _authorized(context, token: str) -> bool:
    if not token:
        return True
    want = f"Bearer {token}".encode()
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            return hmac.compare_digest(str(v).encode(), want)
    return False


class StreamRecService(pb_grpc.StreamRecServicer):
    def __init__(self, cfg: Config, device: torch.device, health_servicer=None):
        self.cfg = cfg
        self.device = device
        self.health = health_servicer
        root = Path(cfg.serving.data_dir)
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
        self.requests_served = 0
        self.events_served = 0
        self.max_snapshot_bytes = 64 * 1024**3
        self.merger = RequestMerger(lambda v, b: v.predict(b), lambda v: v.fields, lambda v: v.dense_dim,
                                    cfg.serving.merge_max_events)
        restored = restore_newest(self.versions, cfg, device)  # a restart serves what it served before
        if restored is not None:
            self._swap(restored)

    # -- versions -------------------------------------------------------
    @property
    def current(self) -> ServedVersion | None:
        return self._current

    def _acquire(self) -> ServedVersion | None:
        while True:
            v = self._current
            if v is None or v.acquire():
                return v
            # retired and closed between the read and acquire: the new one is in place, retry

    def _swap(self, new: ServedVersion) -> None:
        with self._swap_lock:
            closed = self._closed
            if not closed:
                old, self._current = self._current, new
        if closed:  # an install that outlived close(): never current; its complete directory is kept for the next start
            new.retire(keep_dir=True)
            raise SnapshotError(f"server is shutting down; version {new.version} is kept for the next start", code="UNAVAILABLE")
        if self.health is not None:
            self.health.set("", health_pb2.HealthCheckResponse.SERVING)
            self.health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if old is not None:
            old.retire()

    def install(self, staged: Path, manifest) -> ServedVersion:
        """Load a verified snapshot directory and swap it in (used by PushSnapshot and tests)."""
        with self._push_lock:
            if self._closed:
                raise SnapshotError("server is shutting down", code="UNAVAILABLE")
            self._precheck(manifest)
            # a reference on the parent while loading: close() may retire it meanwhile, and a delta
            # copies its store (it was closed under the load, or the load failed)
            parent = self._acquire()
            try:
                v = load_version(staged, manifest, parent, self.versions, self.cfg, self.device)
            finally:
                if parent is not None:
                    parent.release()
            self._swap(v)
            log.info("serving version %d (%s, parent %s, %d rows)", v.version, manifest.kind,
                     manifest.parent_version, v.rows_held)
            return v

    def _precheck(self, manifest) -> None:
        cur = self._current
        if cur is not None and manifest.version <= cur.version:
            raise SnapshotError(f"version {manifest.version} is not newer than the served {cur.version}", code="FAILED_PRECONDITION")
        if manifest.kind == "delta" and (cur is None or cur.version != manifest.parent_version):
            have = "none" if cur is None else cur.version
            raise SnapshotError(f"parent_version: delta needs parent {manifest.parent_version}, serving {have}; send a full snapshot", code="FAILED_PRECONDITION")

    def close(self) -> None:
        """Stop serving; the current version's directory stays for the next start to restore."""
        with self._swap_lock:
            self._closed = True  # a push still loading is not swapped in after this (see _swap)
            old, self._current = self._current, None
        if old is not None:
            old.retire(keep_dir=True)

    # -- RPCs -----------------------------------------------------------
    def Predict(self, request, context):
        if not _authorized(context, self.cfg.serving.predict_token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Predict needs metadata 'authorization: Bearer <token>'")
        v = self._acquire()
        if v is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no model loaded yet; push a snapshot first")
        try:
            try:
                batch, rids = request_to_batch_ids(request, v.fields, v.dense_dim, self.cfg.serving.max_batch)
            except RequestError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            scores = self.merger.score(v, batch)  # with requests that queued meanwhile, on the same version
            version = v.version
        finally:
            v.release()
        with self._count_lock:
            self.requests_served += 1
            self.events_served += len(scores)
        resp = pb.PredictResponse(model_version=version)
        resp.scores.extend(scores.tolist())
        if rids:
            resp.request_ids.extend(rids)
        return resp

    def PushSnapshot(self, request_iterator, context):
        if not _authorized(context, self.cfg.serving.push_token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "PushSnapshot needs metadata 'authorization: Bearer <token>'")
        try:
            staged, manifest = receive_snapshot(request_iterator, self.staging, self.max_snapshot_bytes, self._precheck)
            t0 = time.perf_counter()
            try:
                v = self.install(staged, manifest)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            return pb.PushResponse(accepted=True, version=v.version, load_seconds=time.perf_counter() - t0)
        except SnapshotError as e:
            cur = self._current
            log.warning("refused snapshot: %s %s (still serving %s)", e.code, e, cur.version if cur else None)
            context.abort(getattr(grpc.StatusCode, e.code), str(e))

    def Status(self, request, context):
        v = self._current
        resp = pb.StatusResponse(requests_served=self.requests_served, events_served=self.events_served)
        if v is not None:
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
            for k, x in m.metrics.items():
                resp.metrics[k] = float(x)
        return resp


class ServingServer:
    """A running server: ``.port``, ``.service`` (current version, counters), ``.stop()``.

    Limits, set explicitly: ``serving.max_message_mb`` caps every gRPC message in
    both directions (``grpc.max_receive/send_message_length``); a bigger request is
    refused by gRPC itself with ``RESOURCE_EXHAUSTED`` before it reaches Python.
    ``serving.max_batch`` caps events per Predict (``INVALID_ARGUMENT`` naming
    ``events`` / ``columns.size``). Snapshots stream in chunks, so their size is bounded
    by ``max_snapshot_bytes`` rather than the message limit. On start it serves the
    newest complete version left in ``serving.data_dir`` (see ``version.restore_newest``).
    """

    def __init__(self, cfg: Config, device: torch.device | str | None = None, port: int | None = None):
        self.cfg = cfg
        s = cfg.serving
        self.device = resolve_device(device or getattr(getattr(cfg, "trainer", None), "device", "auto")) \
            if not isinstance(device, torch.device) else device
        limit = int(s.max_message_mb) * 1024 * 1024
        self.health = health.HealthServicer()
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.service = StreamRecService(cfg, self.device, self.health)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max(2, s.workers), thread_name_prefix="serving"),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_StreamRecServicer_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (pb.DESCRIPTOR.services_by_name["StreamRec"].full_name, health.SERVICE_NAME, reflection.SERVICE_NAME),
            self.server)
        addr = f"{s.host}:{s.port if port is None else port}"
        if s.tls_cert:
            creds = grpc.ssl_server_credentials([(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())])
            self.port = self.server.add_secure_port(addr, creds)
        else:
            self.port = self.server.add_insecure_port(addr)
        if not self.port:
            raise OSError(f"cannot listen on {addr}")
        self.host = s.host
        self.tls = bool(s.tls_cert)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "ServingServer":
        self.server.start()
        log.info("serving on %s (%s, device %s)", self.target, "TLS" if self.tls else "plaintext", self.device)
        return self

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait(grace + 5)
        self.service.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)

    def __enter__(self) -> "ServingServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(0.5)


def serve(cfg: Config, device: torch.device | str | None = None, port: int | None = None) -> ServingServer:
    """Start a server for ``cfg.serving`` and return its handle (already listening)."""
    if cfg.serving.torch_threads > 0:
        torch.set_num_threads(cfg.serving.torch_threads)
    return ServingServer(cfg, device, port).start()
