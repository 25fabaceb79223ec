"""Admission control: every RPC runs in a lane (its own thread pool), and a lane holds at most
``limit`` calls at once (running, or waiting for one of its threads). A call that arrives at a
full lane is not queued: it is refused at once with ``RESOURCE_EXHAUSTED`` naming the limit.

Why lanes: with one pool for everything, a flood of Predict calls (or of long-lived health
``Watch`` / reflection streams, which need no token) would take every thread, and pushes,
Status and health checks would wait behind them. With lanes, each kind of call can only use
up its own threads.

How: gRPC's sync server runs a handler on ``behavior.experimental_thread_pool`` when the
behavior has one (``grpc._server._select_thread_pool_for_behavior``). :class:`Lanes` is a
server interceptor, run by gRPC on its serving thread when a call arrives; it gives each
method's behavior its lane's :class:`LanePool`. ``LanePool.submit`` (called on arrival,
before the call waits for a thread) counts the call in, or, when the lane is full, hands it to
a small shared pool of refusers whose only work is the refusal. The count drops when the
submitted work returns, whatever happened to the call (a client that gave up while its call
waited included), so it cannot leak.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Callable

import grpc

_local = threading.local()


class LanePool(futures.ThreadPoolExecutor):
    """A thread pool that admits at most ``limit`` calls at once; the rest go to ``overflow`` refused."""

    def __init__(self, name: str, threads: int, limit: int, overflow: futures.ThreadPoolExecutor, refusal: str):
        super().__init__(max_workers=max(1, threads), thread_name_prefix=f"lane-{name}")
        self.name = name
        self.limit = max(1, int(limit))
        self.refusal = refusal  # the RESOURCE_EXHAUSTED details for a call over the limit
        self._overflow = overflow
        self._count_lock = threading.Lock()
        self.held = 0  # calls admitted and not finished
        self.refused = 0

    def submit(self, fn, /, *args, **kwargs):
        with self._count_lock:
            ok = self.held < self.limit
            if ok:
                self.held += 1
            else:
                self.refused += 1
        if not ok:
            return self._overflow.submit(self._run, False, fn, args, kwargs)
        try:
            return super().submit(self._run, True, fn, args, kwargs)
        except BaseException:  # shut down: not admitted after all
            with self._count_lock:
                self.held -= 1
            raise

    def _run(self, admitted: bool, fn, args, kwargs):
        _local.admitted = admitted
        try:
            return fn(*args, **kwargs)
        finally:
            _local.admitted = None
            if admitted:
                with self._count_lock:
                    self.held -= 1


def _guard(behavior: Callable, pool: LanePool) -> Callable:
    """The behavior, refusing at once when its call was not admitted."""

    def run(request, context):
        if getattr(_local, "admitted", None) is False:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, pool.refusal)
        return behavior(request, context)

    run.experimental_thread_pool = pool
    return run


class Lanes(grpc.ServerInterceptor):
    """Assigns every method to a lane: ``route(method) -> lane name``; ``lanes``: name -> (threads, limit, refusal)."""

    def __init__(self, lanes: dict[str, tuple[int, int, str]], route: Callable[[str], str], overflow_threads: int = 2):
        self.overflow = futures.ThreadPoolExecutor(max_workers=overflow_threads, thread_name_prefix="lane-refuse")
        self.pools = {name: LanePool(name, t, lim, self.overflow, why) for name, (t, lim, why) in lanes.items()}
        self.route = route

    @property
    def capacity(self) -> int:
        """Calls all lanes together may hold."""
        return sum(p.limit for p in self.pools.values())

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        pool = self.pools[self.route(handler_call_details.method)]
        kind = ("stream" if handler.request_streaming else "unary") + "_" + \
               ("stream" if handler.response_streaming else "unary")
        behavior = getattr(handler, kind)
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(_guard(behavior, pool), request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def shutdown(self) -> None:
        for p in self.pools.values():
            p.shutdown(wait=False)
        self.overflow.shutdown(wait=False)
