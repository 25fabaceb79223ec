"""Lazy package exports (PEP 562): a package lists its public names in ``__init__``
but imports each one's module on first use.

Why: one process rarely needs a whole package. The trainer pushes snapshots with
``streamrec.serving.SnapshotPusher`` and must not pay for the server's compiled row index
(numba and its compiler, a large share of a process's resident memory); a benchmark
generating ids from ``streamrec.ingest.synthetic`` must not load Kafka clients and pyarrow.
An eager ``from .x import y`` line would make every such process carry all of it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, modules: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` where ``modules`` maps a submodule
    (``".codec"``) to the public names it defines, space-separated. Submodules
    themselves (``package.synthetic``) resolve too."""
    exports = {name: mod for mod, names in modules.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        mod = exports.get(name)
        if mod is not None:
            value = getattr(importlib.import_module(mod, package), name)
        else:
            try:
                value = importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        globals_of(package)[name] = value  # cache: later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals_of(package)) | set(exports))

    return __getattr__, __dir__


def globals_of(package: str) -> dict:
    import sys

    return vars(sys.modules[package])
