"""No production module imports another module that imports it back, at any depth and in any
place: top level, inside a function, or under ``TYPE_CHECKING``. A cycle means neither module
reads alone; ``serve()`` (``serving/launch.py``) sits above both the one-process server and
the serving group for this reason."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.source import SOURCE_TREES, nodes

pytestmark = SOURCE_TREES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ingest", "trainer", "embedding_store", "serving", "sketch", "streamrec")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "streamrec":
        parts.insert(0, "streamrec")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for d in PACKAGES for p in (ROOT / d).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the streamrec modules it imports anywhere in its source."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in nodes(path):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_init_pair(group: list[str]) -> bool:
    """A package's ``__init__`` naming its own submodules (its public surface) is not a cycle of code."""
    return len(group) == 2 and group[1].startswith(group[0] + ".")


def test_serving_server_and_group_do_not_import_each_other():
    g = import_graph()
    assert "streamrec.serving.server" in g["streamrec.serving.group"]  # the group runs ServingServers
    assert "streamrec.serving.group" not in g["streamrec.serving.server"]
    assert {"streamrec.serving.server", "streamrec.serving.group"} <= g["streamrec.serving.launch"]


def test_no_production_module_imports_one_that_imports_it_back():
    found = [c for c in cycles(import_graph()) if not _is_package_init_pair(c)]
    assert found == []


def test_the_check_sees_a_cycle_through_a_function_level_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
