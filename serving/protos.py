"""Generate the committed gRPC code from ``streamrec.proto``.

The generated modules ``streamrec_pb2.py`` and ``streamrec_pb2_grpc.py`` are
committed next to the ``.proto`` and never generated at import. After editing the
``.proto``, regenerate them from the repository root::

    .venv/bin/python -m streamrec.serving.protos

The ``.proto`` is compiled as ``streamrec/serving/streamrec.proto`` (copied into a
temporary include root), so the generated imports read
``from streamrec.serving import streamrec_pb2``: the installed package's name,
whatever folder the source lives in. The generated code requires at least the
grpcio and protobuf versions that ``pyproject.toml`` names; a test fails when
the committed code is stale.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO = Path(__file__).with_name("streamrec.proto")
PACKAGE_PATH = Path("streamrec/serving")  # where the .proto sits in the installed package
GENERATED = ("streamrec_pb2.py", "streamrec_pb2_grpc.py")


def generate(out_dir: Path | None = None) -> int:
    """Run protoc; write the generated modules into ``out_dir`` (default: next to the .proto)."""
    import grpc_tools
    from grpc_tools import protoc

    out = Path(out_dir) if out_dir else PROTO.parent
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="streamrec-protoc-") as tmp:
        root = Path(tmp)
        (root / PACKAGE_PATH).mkdir(parents=True)
        shutil.copy(PROTO, root / PACKAGE_PATH / PROTO.name)
        args = ["grpc_tools.protoc", f"-I{root}", f"-I{include}", f"--python_out={root}",
                f"--grpc_python_out={root}", str(PACKAGE_PATH / PROTO.name)]
        rc = protoc.main(args)
        if rc == 0:
            out.mkdir(parents=True, exist_ok=True)
            for name in GENERATED:
                shutil.copy(root / PACKAGE_PATH / name, out / name)
    return rc


if __name__ == "__main__":
    sys.exit(generate())
