#!/usr/bin/env bash
# Create .venv at the repository root and install streamrec with its pinned dependencies.
# Idempotent: re-running only installs what changed. Used by both README commands and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.streamrec-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  # torch first, from the pin, so nothing later can pull a multi-GB CUDA build
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt "torch==2.13.0"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
  echo "$want" > "$stamp"
fi
