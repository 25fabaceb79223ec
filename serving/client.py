"""Python clients: ``ServingClient`` (Predict / Status / health) and ``SnapshotPusher``
(the built-in ``streamrec.snapshot.Pusher``: what the trainer pushes snapshots with; chunked,
bearer token, retries with backoff).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamrec.serving.serving_config import ServingConfig
from streamrec.snapshot import PushError, PusherFactory, PushResult, SnapshotError, is_retryable

from .convert import events_to_request
from .pb import pb, pb_grpc
from .targets import serving_target

log = logging.getLogger("streamrec.serving")

_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def answer_dict(msg) -> dict[str, Any]:
    """An answer message as a plain dict: every field present (its default when unset), field names as in
    the ``.proto``, and 64-bit integers (versions, counts, times) as numbers, where protobuf's JSON mapping
    writes them as strings."""
    d = MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    _numbers(msg, d)
    return d


def _numbers(msg, d: dict) -> None:
    for f in msg.DESCRIPTOR.fields:
        if f.name not in d:
            continue
        v = getattr(msg, f.name)
        if f.type in _INT64:
            d[f.name] = [int(x) for x in v] if f.is_repeated else int(v)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                for k, sub in v.items():
                    key = str(k).lower() if isinstance(k, bool) else str(k)
                    if vf.type == FieldDescriptor.TYPE_MESSAGE:
                        _numbers(sub, d[f.name][key])
                    elif vf.type in _INT64:
                        d[f.name][key] = int(sub)
            elif f.is_repeated:
                for sub, sd in zip(v, d[f.name]):
                    _numbers(sub, sd)
            else:
                _numbers(v, d[f.name])


def make_channel(target: str, tls_ca: str = "", max_message_mb: int = 64, server_name: str = "",
                 own_connection: bool = False) -> grpc.Channel:
    """A channel to ``target``. gRPC shares one connection among a process's channels to the same target with
    the same options; ``own_connection`` gives this channel its own (a serving group, ``serving.processes``,
    spreads connections over its processes, not requests)."""
    limit = int(max_message_mb) * 1024 * 1024
    opts = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    if own_connection:
        opts.append(("grpc.use_local_subchannel_pool", 1))
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    if tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        return grpc.secure_channel(target, creds, options=opts)
    return grpc.insecure_channel(target, options=opts)


def _metadata(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),) if token else ()


class ServingClient:
    """Predict, Status and health against one server; ``rollback`` and ``accept`` (the operator's calls, with
    ``push_token``, which they need like a push)."""

    def __init__(self, target: str, token: str = "", tls_ca: str = "", timeout: float = 10.0,
                 max_message_mb: int = 64, own_connection: bool = False, push_token: str = ""):
        self.channel = make_channel(target, tls_ca, max_message_mb, own_connection=own_connection)
        self.stub = pb_grpc.StreamRecStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.token = token
        self.push_token = push_token
        self.timeout = timeout

    @classmethod
    def from_config(cls, serving: ServingConfig, **kw) -> "ServingClient":
        """A client of :func:`~.targets.serving_target` with the section's tokens, CA and message limit."""
        kw.setdefault("push_token", serving.push_token)
        return cls(serving_target(serving), token=serving.predict_token, tls_ca=serving.tls_ca,
                   max_message_mb=serving.max_message_mb, **kw)

    def predict(self, events: Iterable[Mapping[str, Any]], columns: bool = True) -> tuple[np.ndarray, int]:
        """The first task's scores (float32, one per event) and the model version that produced them.

        ``columns`` sends the column-wise form (the fast path); False sends one message per event."""
        return self.predict_request(events_to_request(events, columns=columns))

    def predict_request(self, request) -> tuple[np.ndarray, int]:
        resp = self.stub.Predict(request, timeout=self.timeout, metadata=_metadata(self.token))
        return np.asarray(resp.scores, dtype=np.float32), int(resp.model_version)

    def predict_line(self, events: Iterable[Mapping[str, Any]], model_line: str = "",
                     columns: bool = True) -> tuple[np.ndarray, int, str]:
        """Like ``predict``, plus the model line that answered; ``model_line`` asks for one line (empty: the
        server's split decides)."""
        return self.predict_request_line(events_to_request(events, columns=columns), model_line)

    def predict_request_line(self, request, model_line: str = "") -> tuple[np.ndarray, int, str]:
        if model_line:
            request.model_line = model_line
        resp = self.stub.Predict(request, timeout=self.timeout, metadata=_metadata(self.token))
        return np.asarray(resp.scores, dtype=np.float32), int(resp.model_version), resp.model_line

    def predict_tasks(self, events: Iterable[Mapping[str, Any]],
                      columns: bool = True) -> tuple[dict[str, np.ndarray], int]:
        """Every task's scores (task name -> float32, one per event, in the model's task order) and the model
        version that produced them."""
        return self.predict_request_tasks(events_to_request(events, columns=columns))

    def predict_request_tasks(self, request) -> tuple[dict[str, np.ndarray], int]:
        resp = self.stub.Predict(request, timeout=self.timeout, metadata=_metadata(self.token))
        return ({t.task: np.asarray(t.scores, dtype=np.float32) for t in resp.task_scores},
                int(resp.model_version))

    def status(self) -> dict[str, Any]:
        resp = self.stub.Status(pb.StatusRequest(), timeout=self.timeout, metadata=_metadata(self.token))
        return answer_dict(resp)

    def rollback(self, to_version: int = 0, release: bool = False, model_line: str = "") -> dict[str, Any]:
        """Serve and pin kept version ``to_version`` (0: the one promoted before the served one), or with
        ``release`` unpin, on ``model_line`` (empty: main); the answer's ``version``, ``pinned``,
        ``swap_seconds``, ``message`` and ``model_line``."""
        resp = self.stub.Rollback(pb.RollbackRequest(to_version=int(to_version), release=bool(release),
                                                     model_line=model_line),
                                  timeout=self.timeout, metadata=_metadata(self.push_token))
        return answer_dict(resp)

    def accept(self, version: int = 0, model_line: str = "") -> dict[str, Any]:
        """Promote the version the guard holds back (0: the newest held one) on ``model_line`` (empty: main);
        ``version``, ``message`` and ``model_line``."""
        resp = self.stub.AcceptVersion(pb.AcceptRequest(version=int(version), model_line=model_line),
                                       timeout=self.timeout,
                                       metadata=_metadata(self.push_token))
        return answer_dict(resp)

    def shadow_scores(self, limit: int = 0) -> list[tuple[str, str, str, float, float]]:
        """The shadow comparison's newest per-event scores: ``(request_id, line, shadow_line, line_score,
        shadow_score)``, oldest first (push token)."""
        resp = self.stub.ShadowScores(pb.ShadowScoresRequest(limit=int(limit)), timeout=self.timeout,
                                      metadata=_metadata(self.push_token))
        return [(s.request_id, s.model_line, s.shadow_line, s.line_score, s.shadow_score) for s in resp.scores]

    def health(self, service: str = "") -> str:
        resp = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "ServingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def snapshot_chunks(snapshot_dir, chunk_bytes: int = 1 << 20) -> Iterator:
    """The PushSnapshot stream for a directory: manifest first, then each file in order."""
    from streamrec.snapshot import MANIFEST, read_manifest  # the snapshot format loads torch: pushers only

    d = Path(snapshot_dir)
    manifest = read_manifest(d)
    yield pb.SnapshotChunk(manifest_json=(d / MANIFEST).read_bytes())
    for name in manifest.files:
        with open(d / name, "rb") as f:
            offset = 0
            while True:
                data = f.read(chunk_bytes)
                if not data and offset > 0:
                    break
                yield pb.SnapshotChunk(chunk=pb.FileChunk(name=name, offset=offset, data=data))
                offset += len(data)
                if not data:
                    break


class SnapshotPusher:
    """Pushes snapshot directories over gRPC ``PushSnapshot``: the built-in
    :class:`streamrec.snapshot.Pusher`. Never raises into the caller unless ``raise_errors``.

    Transient failures (server down, deadline) are retried with exponential
    backoff and jitter; refusals (wrong parent, corrupt, unauthenticated) are not.
    """

    def __init__(self, target: str, token: str = "", tls_ca: str = "", chunk_bytes: int = 1 << 20,
                 attempts: int = 5, backoff_s: float = 0.2, max_backoff_s: float = 5.0, timeout_s: float = 300.0,
                 max_message_mb: int = 64, raise_errors: bool = False, extra_metadata: tuple = ()):
        self.target = target
        self.token = token
        self.metadata = _metadata(token) + tuple(extra_metadata)  # extra: a serving group's key (siblings.py)
        self.chunk_bytes = int(chunk_bytes)
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.raise_errors = raise_errors
        self.channel = make_channel(target, tls_ca, max_message_mb)
        self.stub = pb_grpc.StreamRecStub(self.channel)

    @classmethod
    def from_config(cls, serving: ServingConfig, target: str | None = None, **kw) -> "SnapshotPusher":
        """A pusher with the section's push token, CA and message limit, to ``target`` (default:
        :func:`~.targets.serving_target`)."""
        return cls(target or serving_target(serving), token=serving.push_token, tls_ca=serving.tls_ca,
                   max_message_mb=serving.max_message_mb, **kw)

    @classmethod
    def factory(cls, serving: ServingConfig, **kw) -> PusherFactory:
        """``target -> SnapshotPusher`` with the section's settings: the trainer's ``pusher_factory``.
        One attempt per push by default: the trainer's publisher retries with its own backoff."""
        kw.setdefault("attempts", 1)
        return lambda target: cls.from_config(serving, target=target, **kw)

    def push(self, snapshot_dir) -> PushResult:
        t0 = time.perf_counter()
        result = PushResult(ok=False)
        for attempt in range(1, self.attempts + 1):
            result.attempts = attempt
            try:
                # read and check the manifest here: inside the request stream gRPC turns a SnapshotError
                # into a retryable UNKNOWN ("Exception iterating requests!")
                from streamrec.snapshot import read_manifest

                read_manifest(snapshot_dir)
                resp = self.stub.PushSnapshot(snapshot_chunks(snapshot_dir, self.chunk_bytes),
                                              timeout=self.timeout_s, metadata=self.metadata)
                result = PushResult(True, int(resp.version), "OK", "", 0.0, attempt)
                break
            except (SnapshotError, OSError) as e:
                result = PushResult(False, 0, "INVALID_ARGUMENT", f"local snapshot unreadable: {e}", 0.0, attempt)
                break
            except grpc.RpcError as e:
                code = e.code()
                # refused as not newer (or no parent): say what it serves, so the trainer can number past it
                served = self._served_version() if code == grpc.StatusCode.FAILED_PRECONDITION else 0
                result = PushResult(False, served, code.name, e.details() or "", 0.0, attempt)
                if not is_retryable(code.name) or attempt == self.attempts:
                    break
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random())
                log.warning("push of %s failed (%s: %s); retry %d in %.2fs", snapshot_dir, code.name,
                            e.details(), attempt, delay)
                time.sleep(delay)
        result.seconds = time.perf_counter() - t0
        if not result.ok and self.raise_errors:
            raise PushError(result)
        return result

    def _served_version(self) -> int:
        """The newest version the server holds, served or held back by its guard (0 when none or it does not say)."""
        try:
            st = self.stub.Status(pb.StatusRequest(), timeout=10, metadata=_metadata(self.token))
            return max(int(st.version), int(st.newest_version))
        except grpc.RpcError:
            return 0

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "SnapshotPusher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
