"""Import point for the generated messages and stubs of ``streamrec.proto``.

The generated code is committed (see :mod:`.protos`); it needs the grpcio and
protobuf versions ``pyproject.toml`` requires, and says so if they are older.
"""

from __future__ import annotations

from . import streamrec_pb2 as pb
from . import streamrec_pb2_grpc as pb_grpc

SERVICE = "streamrec.v1.StreamRec"
__all__ = ["pb", "pb_grpc", "SERVICE"]
