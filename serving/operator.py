"""The operator's RPCs: ``Rollback`` (serve and pin a kept version, or release the pin) and ``AcceptVersion``
(promote the held version: the stream really changed), each on one model line (``model_line``, empty = main;
each line has its own book). Both need ``serving.push_token`` like a push: whoever may replace the model may
choose among its versions. ``ShadowScores`` hands out the shadow comparison's per-event scores (``lines.py``)
with the same token. The decisions are the book's (``history.py``); the swap
is the server's, one reference assignment, so a rollback takes effect for the next request."""

from __future__ import annotations

import time

import grpc

from streamrec.snapshot import SnapshotError

from .pb import pb


def _check(service, context, request, message, what: str):
    if not service.authorized(context, service.serving.push_token):
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"{what} needs metadata 'authorization: Bearer <token>' (serving.push_token)")
    try:
        return message.FromString(bytes(request)) if isinstance(request, (bytes, bytearray, memoryview)) else request
    except Exception:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: the bytes are not a {message.DESCRIPTOR.full_name}")


def rollback(service, request, context):
    req = _check(service, context, request, pb.RollbackRequest, "Rollback")
    t0 = time.perf_counter()
    try:
        service = service.lines.service(req.model_line)  # the line's own book and served version (lines.py)
        book = service.book
        with book.lock:  # an install decides and swaps under this lock too: never between these steps
            served = service.current
            target = book.release(served) if req.release else book.rollback(int(req.to_version), served)
            if target is not None and target is not served:
                service.swap_in(target)
            else:
                book.settle(served)
    except SnapshotError as e:
        context.abort(getattr(grpc.StatusCode, e.code), str(e))
    v = service.current
    what = "released; serving" if req.release else "rolled back to"
    return pb.RollbackResponse(version=v.version if v else 0, pinned=book.pinned, model_line=service.line,
                               swap_seconds=time.perf_counter() - t0,
                               message=f"{what} version {v.version if v else 0}"
                                       + (" (pinned until `streamrec rollback --release`)" if book.pinned else ""))


def accept(service, request, context):
    req = _check(service, context, request, pb.AcceptRequest, "AcceptVersion")
    try:
        service = service.lines.service(req.model_line)
        book = service.book
        with book.lock:
            target = book.accept(int(req.version), service.current)
            service.swap_in(target)
    except SnapshotError as e:
        context.abort(getattr(grpc.StatusCode, e.code), str(e))
    return pb.AcceptResponse(version=target.version, model_line=service.line,
                             message=f"accepted version {target.version}; the guard's history starts from it")


def shadow_scores(service, request, context):
    req = _check(service, context, request, pb.ShadowScoresRequest, "ShadowScores")
    log = list(service.lines.shadow_log)
    if req.limit:
        log = log[-int(req.limit):]
    resp = pb.ShadowScoresResponse()
    for rid, line, shadow, a, b in log:
        resp.scores.add(request_id=rid, model_line=line, shadow_line=shadow, line_score=a, shadow_score=b)
    return resp


def operator_handlers(service) -> dict:
    """The operator RPCs' handlers for ``grpc.method_handlers_generic_handler`` (raw request bytes)."""
    return {
        "Rollback": grpc.unary_unary_rpc_method_handler(
            lambda r, c: rollback(service, r, c), response_serializer=pb.RollbackResponse.SerializeToString),
        "AcceptVersion": grpc.unary_unary_rpc_method_handler(
            lambda r, c: accept(service, r, c), response_serializer=pb.AcceptResponse.SerializeToString),
        "ShadowScores": grpc.unary_unary_rpc_method_handler(
            lambda r, c: shadow_scores(service, r, c), response_serializer=pb.ShadowScoresResponse.SerializeToString),
    }
