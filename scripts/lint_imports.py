"""Check the import-linter contracts in pyproject.toml against the package as installed.

The parts live in top-level folders (``ingest/``, ``trainer/``, ...) that install as
``streamrec.ingest``, ``streamrec.trainer``, ... (setuptools' ``package-dir``). The
import graph tool (grimp) finds subpackages by walking the ``streamrec/`` folder, so
this script first stages a copy of the sources in the installed layout, then runs
``lint-imports`` on it. It also checks the one allowed upward edge: every contract ignores
the same imports, each of ``streamrec.foundation.config`` importing a ``*_types`` leaf of the
package that uses a config value, and those leaves import only the standard library (so the
foundation still loads nothing above it). Usage, from the repository root::

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """``{"streamrec": "streamrec", "streamrec.ingest": "ingest", ...}`` from pyproject.toml."""
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def stage(dest: Path, root: Path = ROOT) -> Path:
    """Copy the Python sources into ``dest`` in the installed layout; return ``dest``."""
    for pkg, folder in sorted(package_dirs(root).items()):  # "streamrec" before "streamrec.x"
        shutil.copytree(root / folder, dest.joinpath(*pkg.split(".")), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    return dest


def lint(staged: Path, root: Path = ROOT) -> subprocess.CompletedProcess:
    """Run lint-imports with the project's contracts over a staged tree."""
    exe = Path(sys.executable).with_name("lint-imports")
    env = dict(os.environ, PYTHONPATH=str(staged))
    return subprocess.run([str(exe), str(root / "pyproject.toml"), "--no-cache"], cwd=staged, env=env,
                          capture_output=True, text=True, timeout=300)


CONFIG_MODULE = "streamrec.foundation.config"


def _module_file(module: str, root: Path) -> Path:
    """The source file of ``module`` (``streamrec.ingest.ingest_types`` -> ``ingest/ingest_types.py``)."""
    dirs = package_dirs(root)
    pkg = max((p for p in dirs if module.startswith(p + ".")), key=len)
    return root / dirs[pkg] / (module[len(pkg) + 1:].replace(".", "/") + ".py")


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Top-level names of the modules ``tree`` imports when it runs (``if TYPE_CHECKING:`` blocks skipped)."""
    out: list[str] = []

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                out.append("." * node.level + (node.module or ""))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            else:  # statements that hold statements: function and class bodies, if/try/with/loops
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []))

    visit(tree.body)
    return out


def check_type_leaves(root: Path = ROOT) -> list[str]:
    """Problems with the contracts' ``ignore_imports`` (empty when none): the lists differ between
    contracts, an entry is not ``streamrec.foundation.config -> <a *_types module>``, or such a
    module imports something beyond the standard library when it runs."""
    with open(root / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    lists = {c["name"]: sorted(c.get("ignore_imports", [])) for c in contracts}
    problems = [f"contract {name!r} ignores {got}, not {lists[contracts[0]['name']]} as the others"
                for name, got in lists.items() if got != lists[contracts[0]["name"]]]
    for entry in sorted({e for got in lists.values() for e in got}):
        importer, _, leaf = (part.strip() for part in entry.partition("->"))
        if importer != CONFIG_MODULE or not leaf.rpartition(".")[2].endswith("_types"):
            problems.append(f"ignore_imports entry {entry!r}: only {CONFIG_MODULE} -> a *_types leaf may be ignored")
            continue
        path = _module_file(leaf, root)
        if not path.is_file():
            problems.append(f"ignore_imports entry {entry!r}: {path.relative_to(root)} does not exist")
            continue
        for name in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            if name.startswith(".") or top not in sys.stdlib_module_names and top != "__future__":
                problems.append(f"{path.relative_to(root)} imports {name}: a *_types leaf imports only the "
                                "standard library (the foundation imports it)")
    return problems


def main() -> int:
    problems = check_type_leaves()
    with tempfile.TemporaryDirectory(prefix="streamrec-lint-") as tmp:
        res = lint(stage(Path(tmp)))
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    for problem in problems:
        print(f"type leaves: {problem}", file=sys.stderr)
    return res.returncode or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
