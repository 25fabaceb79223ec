"""The committed gRPC code (serving/streamrec_pb2*.py) is what protoc makes of streamrec.proto
today (protoc runs in-process, from grpc_tools): an edited .proto cannot ship with stale code."""

from __future__ import annotations


def test_generated_code_is_up_to_date(tmp_path):
    from pathlib import Path

    from streamrec.serving.protos import generate

    assert generate(tmp_path) == 0
    here = Path(__file__).resolve().parents[2] / "serving"
    for name in ("streamrec_pb2.py", "streamrec_pb2_grpc.py"):
        assert (tmp_path / name).read_text() == (here / name).read_text(), \
            f"serving/{name} is stale: run python -m streamrec.serving.protos"
