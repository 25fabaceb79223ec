"""The generated gRPC code for ``serving/streamrec.proto``.

The generated modules ``streamrec_pb2.py`` and ``streamrec_pb2_grpc.py`` are
committed. Regenerate them after editing the .proto, from the repository root::

    .venv/bin/python -m serving.protos

which runs ``python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=.
serving/streamrec.proto`` (the ``-I.`` root makes the generated imports
``from serving import streamrec_pb2``). ``tests/test_serving_proto.py`` fails
when the committed code is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO = Path(__file__).with_name("streamrec.proto")
ROOT = PROTO.parent.parent


def generate(out_dir: Path | None = None) -> int:
    """Run protoc; write into ``out_dir`` (default: next to the .proto)."""
    from grpc_tools import protoc
    import grpc_tools

    out = Path(out_dir) if out_dir else ROOT
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            str(PROTO.relative_to(ROOT))]
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return protoc.main(args)
    finally:
        os.chdir(cwd)


if __name__ == "__main__":
    sys.exit(generate())
