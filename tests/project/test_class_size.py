"""No production class is over 400 lines: a class that big holds several responsibilities, and each
belongs in a part that reads alone (as ``EventConsumer``'s reader, topic guard, dead-letter writer and
crash-loop breaker do, or ``TrainerService``'s resume, positions, step breaker and reporting)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.source import SOURCE_TREES, nodes

pytestmark = SOURCE_TREES

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("ingest", "trainer", "embedding_store", "serving", "sketch", "streamrec")
MAX_LINES = 400


def oversized(paths, limit: int = MAX_LINES) -> list[str]:
    """``"<path> <class> <lines>"`` for every class (nested ones too) longer than ``limit`` lines in ``paths``;
    generated protobuf modules (``*_pb2*.py``) are not ours to split."""
    out = []
    for p in paths:
        if "_pb2" in p.name:
            continue
        for node in nodes(p):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} {node.name} {n}")
    return out


def production_modules() -> list[Path]:
    return sorted(p for d in PRODUCTION for p in (ROOT / d).rglob("*.py"))


def test_no_production_class_is_over_400_lines():
    mods = production_modules()
    assert any(p.name == "kafka_io.py" for p in mods) and any(p.name == "service.py" for p in mods)  # the scan sees them
    assert oversized(mods) == [], "split these classes by responsibility"


def test_the_scan_finds_a_class_over_the_limit(tmp_path):
    body = "\n".join(f"        def m{i}(self):\n            return {i}\n" for i in range(MAX_LINES // 2))
    big = tmp_path / "big.py"
    big.write_text(f"class Small:\n    pass\n\n\nclass Outer:\n    class Big:\n{body}\n")
    generated = tmp_path / "thing_pb2.py"
    generated.write_text(big.read_text())
    found = oversized([big, generated])
    assert len(found) == 2 and {f.split()[1] for f in found} == {"Outer", "Big"}, found
    assert all(f.startswith(str(big)) for f in found)  # the generated module is skipped
    assert oversized([big], limit=10_000) == []
