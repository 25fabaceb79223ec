#!/usr/bin/env bash
# The GPU check, one command on a machine with a CUDA GPU and a CUDA build of PyTorch:
#
#   scripts/gpu_check.sh             # CUDA tests + bench train/store/serve --quick on the GPU
#   scripts/gpu_check.sh --dry-run   # the same steps on the CPU at the smallest sizes (run by the suite)
#   scripts/gpu_check.sh --prepare-only   # only the virtual environment below (for profiling by hand)
#
# On the GPU machine the packages its Python lacks come from .gpu-wheels/ (made on a machine with
# PyPI by scripts/gpu_wheels.sh): they install, with streamrec itself (editable), into a virtual
# environment at $GPU_CHECK_VENV that also sees the host Python's packages (its CUDA torch), so
# nothing is fetched and the host Python is left as it was. With --dry-run nothing is installed:
# the repository's .venv (scripts/setup.sh) runs it.
#
# Writes gpu_check.json (and the tests' log and JUnit XML) to $OUT when set, else runs/gpu_check/;
# exits 0 only when every CUDA test passed and every bench gave its JSON result.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--dry-run" ]; then
  exec "${PYTHON:-.venv/bin/python}" scripts/gpu_check.py "$@"
fi

HOST_PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
VENV=${GPU_CHECK_VENV:-/tmp/streamrec-gpu-venv}
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in $WHEELS: run scripts/gpu_wheels.sh on a machine with PyPI" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "gpu_check: preparing $VENV (host Python: $("$HOST_PY" --version 2>&1))" >&2
  "$HOST_PY" -m venv --without-pip "$VENV"
  host_site=$("$HOST_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # after the venv's own packages, so the carried wheels win over the host's older copies
  echo "$host_site" > "$venv_site/zz-host-site-packages.pth"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$WHEELS"/*.whl
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
fi
[ "${1:-}" = "--prepare-only" ] && { echo "$VENV/bin/python"; exit 0; }
exec "$VENV/bin/python" scripts/gpu_check.py --python "$VENV/bin/python" "$@"
