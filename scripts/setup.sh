#!/usr/bin/env bash
# Create .venv at the repository root and install streamrec with its pinned dependencies.
# Idempotent: re-running only reinstalls when pyproject.toml or constraints.txt changed.
# Used by both README commands and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.streamrec-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log=.venv/setup.log
  echo "setup: installing streamrec and its dependencies into .venv (log: $log)" >&2
  pip=(.venv/bin/python -m pip install --disable-pip-version-check -c constraints.txt)
  # torch first, from the pin, so that nothing later can pull a multi-GB CUDA build
  if ! { "${pip[@]}" "torch==2.13.0" && "${pip[@]}" -e ".[test]"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: install failed; full log in $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
# The numba kernels (the sketch's update, serving's id index) compile once here, as deploy/Dockerfile does for the
# image, into their on-disk cache beside their sources, not in the first sketch or serving process: a compile
# costs seconds of CPU, and several processes starting together on a loaded machine would each compile them.
if ! out=$(.venv/bin/python -c "import numpy as np; from streamrec.sketch.kernels import warm; s = warm()
from streamrec.serving.idindex import IdIndex; IdIndex(np.arange(4)).find(np.arange(2), -1)
print(f'setup: compiled the numba kernels into their cache ({s:.0f} s)' if s > 2 else '')" 2>&1); then
  echo "$out" | tail -n 20 >&2
  echo "setup: compiling the numba kernels failed" >&2
  exit 1
fi
[ -z "$out" ] || echo "$out" >&2
# Every process of the pipeline and the suite imports streamrec's modules: they are compiled to bytecode here, once,
# so that no process compiles them itself (where PYTHONDONTWRITEBYTECODE is set, each process would, every time).
.venv/bin/python -m compileall -q -j 0 streamrec ingest trainer embedding_store sketch serving benchmarks tests \
  >/dev/null || echo "setup: compiling the sources to bytecode failed (each process compiles what it imports)" >&2
