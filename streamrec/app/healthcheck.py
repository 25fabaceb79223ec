"""``python -m streamrec.app.healthcheck HOST:PORT``: exit 0 when the gRPC health service says SERVING.

Used by the compose stack's health check; talks only the standard grpc.health.v1 protocol.
"""

from __future__ import annotations

import sys


def check(target: str, timeout: float = 3.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


if __name__ == "__main__":
    sys.exit(0 if check(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051") else 1)
