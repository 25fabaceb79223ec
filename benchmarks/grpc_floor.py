"""The gRPC transport floor: a server holding only the standard health service, as the
sync (thread pool) or the ``grpc.aio`` (asyncio) kind, and a loop of empty Health
checks against it from N client threads.

Why: it splits ``bench serve``'s gap into what any unary call costs on this machine
(server + client, same cores) and what Predict's own work adds.

Server: ``python -m benchmarks.grpc_floor sync|aio`` prints ``host:port`` and serves
until killed (stdin closed or SIGTERM).
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


def start(kind: str) -> tuple[subprocess.Popen, str]:
    """A floor server of ``kind`` (sync | aio) in its own process, and its target."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.grpc_floor", kind], stdin=subprocess.PIPE,
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


def measure(call_factory, clients: int, seconds: float) -> float:
    """Calls/s of ``clients`` threads, each looping on its own ``call_factory()`` for ``seconds``."""
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
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop_ev.set()
    for t in ths:
        t.join(30)
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


if __name__ == "__main__":
    {"sync": _serve_sync, "aio": _serve_aio}[sys.argv[1]]()
