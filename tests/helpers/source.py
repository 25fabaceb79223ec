"""Parsing the project's own source files in tests.

Why a helper: CPython 3.11's parser keeps its recursion-depth bookkeeping where another thread compiling at the
same moment (a client library's background thread left by an earlier test in the same worker) can disturb it,
and ``ast.parse`` then raises ``SystemError: AST constructor recursion depth mismatch`` for a file that parses
fine. The source is the same on a second attempt; a real syntax error is never retried away.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE_TREES = pytest.mark.xdist_group("source-trees")
"""The tests that walk the production sources' trees: on one xdist worker, which parses each file once."""


def parse(path: Path) -> ast.Module:
    """The module's tree, parsed once per test process while the file is unchanged (several project tests walk
    every production file): callers read the tree and never change it."""
    p = Path(path).resolve()
    st = p.stat()
    key = (p, st.st_mtime_ns, st.st_size)
    tree = _TREES.get(key)
    if tree is None:
        tree = _TREES[key] = _parse(p)
    return tree


_TREES: dict[tuple[Path, int, int], ast.Module] = {}


def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module's tree in ``ast.walk``'s order, walked once per parsed tree (walking each file
    again is most of what the project's source checks cost)."""
    tree = parse(path)
    walked = _WALKED.get(id(tree))
    if walked is None or walked[0] is not tree:
        walked = _WALKED[id(tree)] = (tree, tuple(ast.walk(tree)))
    return walked[1]


_WALKED: dict[int, tuple[ast.Module, tuple[ast.AST, ...]]] = {}


def _parse(path: Path) -> ast.Module:
    text = Path(path).read_text(encoding="utf-8")
    for attempt in range(5):
        try:
            return ast.parse(text, filename=str(path))
        except SystemError:  # the interpreter's transient bookkeeping error, not the file's
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
