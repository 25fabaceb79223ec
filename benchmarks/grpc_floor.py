"""The gRPC transport floor: a server holding only the standard health service, as the
sync (thread pool) or the ``grpc.aio`` (asyncio) kind, and a loop of empty Health
checks against it from N client threads.

Why: it splits ``bench serve``'s gap into what any unary call costs on this machine
(server + client, same cores) and what Predict's own work adds.

``payload`` is the same sync server answering a raw-bytes method with a fixed reply of
``N`` bytes (``python -m streamrec.benchmarks.grpc_floor payload N``), called with pre-serialized
request bytes: the transport of a real Predict's bytes both ways, with no protobuf
decoding and no work on either side.

Server: ``python -m streamrec.benchmarks.grpc_floor sync|aio|payload [N]`` prints ``host:port`` and
serves until killed (stdin closed or SIGTERM).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def _serve_sync() -> None:
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(0)


PAYLOAD_METHOD = "/streamrec.floor.Payload/Call"


def _serve_payload(reply_bytes: str) -> None:
    from concurrent import futures

    import grpc

    reply = bytes(int(reply_bytes))
    handler = grpc.method_handlers_generic_handler(
        "streamrec.floor.Payload", {"Call": grpc.unary_unary_rpc_method_handler(lambda req, ctx: reply)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[handler],
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"127.0.0.1:{port}", flush=True)
    sys.stdin.read()
    server.stop(0)


def _serve_aio() -> None:
    import asyncio

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    async def run():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"127.0.0.1:{port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(0)

    asyncio.run(run())


def start(kind: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A floor server of ``kind`` (sync | aio | payload N) in its own process, and its target."""
    proc = subprocess.Popen([sys.executable, "-m", "streamrec.benchmarks.grpc_floor", kind, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    target = proc.stdout.readline().strip()
    if not target:
        proc.kill()
        raise RuntimeError(f"the {kind} floor server did not start")
    return proc, target


def stop(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def measure(call_factory, clients: int, seconds: float, cpu=None) -> float:
    """Calls/s of ``clients`` threads, each looping on its own ``call_factory()`` for ``seconds``.

    ``cpu``: an optional list; it gets the CPU seconds per call of this process and of each
    ``psutil.Process`` given in it (replaced in place by the figures)."""
    counts = [0] * clients
    stop_ev = threading.Event()
    started = threading.Barrier(clients + 1)

    def run(i):
        call = call_factory()
        call()
        started.wait()
        n = 0
        while not stop_ev.is_set():
            call()
            n += 1
        counts[i] = n

    ths = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in ths:
        t.start()
    started.wait(60)
    procs = None
    if cpu is not None:
        import psutil

        procs = [psutil.Process(), *cpu]
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
    t0 = time.perf_counter()
    time.sleep(seconds)
    if procs is not None:
        cpu1 = [sum(p.cpu_times()[:2]) for p in procs]
    stop_ev.set()
    for t in ths:
        t.join(30)
    calls = max(1, sum(counts))
    if procs is not None:
        cpu[:] = [(b - a) / calls for a, b in zip(cpu0, cpu1)]
    return sum(counts) / (time.perf_counter() - t0)


def health_call(target: str):
    """A factory of empty Health checks on one channel (one per client thread)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def factory():
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
        req = health_pb2.HealthCheckRequest()
        return lambda: stub.Check(req, timeout=30)

    return factory


def payload_call(target: str, request: bytes):
    """A factory of raw-bytes calls to the payload server, sending ``request`` as it is."""
    import grpc

    def factory():
        call = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]).unary_unary(
            PAYLOAD_METHOD)
        return lambda: call(request, timeout=30)

    return factory


if __name__ == "__main__":
    {"sync": _serve_sync, "aio": _serve_aio, "payload": _serve_payload}[sys.argv[1]](*sys.argv[2:])
