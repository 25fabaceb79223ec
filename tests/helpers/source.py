"""Parsing the project's own source files in tests.

Why a helper: CPython 3.11's parser keeps its recursion-depth bookkeeping where another thread compiling at the
same moment (a client library's background thread left by an earlier test in the same worker) can disturb it,
and ``ast.parse`` then raises ``SystemError: AST constructor recursion depth mismatch`` for a file that parses
fine. The source is the same on a second attempt; a real syntax error is never retried away.
"""

from __future__ import annotations

import ast
from pathlib import Path


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


def _parse(path: Path) -> ast.Module:
    text = Path(path).read_text(encoding="utf-8")
    for attempt in range(5):
        try:
            return ast.parse(text, filename=str(path))
        except SystemError:  # the interpreter's transient bookkeeping error, not the file's
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
