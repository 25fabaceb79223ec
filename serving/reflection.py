"""gRPC server reflection under both names clients use: ``grpc.reflection.v1`` (current grpcurl,
Postman, grpcui) and ``grpc.reflection.v1alpha`` (older clients).

grpcio-reflection ships only the v1alpha service. The v1 protocol is the same messages under
another package name (``grpc/reflection/v1/reflection.proto`` vs ``.../v1alpha/...``: same
fields, same numbers, so the same bytes on the wire); so the v1 service here is the library's
v1alpha servicer registered under the v1 name, and the v1 file descriptor (v1alpha's, renamed)
is added to the descriptor pool so that reflection can describe the v1 service too.
"""

from __future__ import annotations

from typing import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection as v1alpha
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1ALPHA_SERVICE = v1alpha.SERVICE_NAME
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool) -> None:
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    alpha_pb2.DESCRIPTOR.CopyToProto(fdp)
    old = "." + alpha_pb2.DESCRIPTOR.package + "."
    fdp.name, fdp.package = V1_FILE, V1_PACKAGE
    fdp.ClearField("options")
    for msg in fdp.message_type:
        for f in msg.field:
            if f.type_name.startswith(old):
                f.type_name = f".{V1_PACKAGE}." + f.type_name[len(old):]
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = f".{V1_PACKAGE}." + m.input_type[len(old):]
            m.output_type = f".{V1_PACKAGE}." + m.output_type[len(old):]
    pool.AddSerializedFile(fdp.SerializeToString())


def enable_reflection(service_names: Iterable[str], server: grpc.Server) -> tuple[str, ...]:
    """Serve reflection (v1 and v1alpha) for ``service_names`` (and for both reflection services)."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    servicer = v1alpha.ReflectionServicer(names, pool=pool)
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request_deserializer=alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=alpha_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers(tuple(grpc.method_handlers_generic_handler(s, {"ServerReflectionInfo": method})
                                          for s in (V1_SERVICE, V1ALPHA_SERVICE)))
    return names
