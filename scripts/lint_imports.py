"""Check the import-linter contracts in pyproject.toml against the package as installed.

The parts live in top-level folders (``ingest/``, ``trainer/``, ...) that install as
``streamrec.ingest``, ``streamrec.trainer``, ... (setuptools' ``package-dir``). The
import graph tool (grimp) finds subpackages by walking the ``streamrec/`` folder, so
this script first stages a copy of the sources in the installed layout, then runs
``lint-imports`` on it. It also checks that no contract lists ``ignore_imports``: the layers hold
without exceptions. Usage, from the repository root::

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

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


def check_no_ignores(root: Path = ROOT) -> list[str]:
    """Contracts that list ``ignore_imports`` (empty when none): every layer rule holds without exceptions,
    so an upward import fails the lint instead of joining a list."""
    with open(root / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return [f"contract {c['name']!r} ignores {c['ignore_imports']}: fix the import instead"
            for c in contracts if c.get("ignore_imports")]


def main() -> int:
    problems = check_no_ignores()
    with tempfile.TemporaryDirectory(prefix="streamrec-lint-") as tmp:
        res = lint(stage(Path(tmp)))
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    for problem in problems:
        print(f"contracts: {problem}", file=sys.stderr)
    return res.returncode or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
