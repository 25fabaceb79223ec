"""The GPU check's dry run (``scripts/gpu_check.sh --dry-run``), made once per session: tests/project/test_gpu_check.py
checks its summary, and tests/project/test_benches.py reads the ``bench train`` figures it measured (``--tiny``,
its ``--host-ceiling`` and ``--device-busy``) instead of running those three benches a second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the tests that use the dry run run on one xdist worker, so it runs once
GPU_CHECK_WORKER = pytest.mark.xdist_group("gpu-check-dry-run")
# the dry run's benches; bench name in gpu_check.py -> the `streamrec bench` arguments it runs (with --tiny --json
# --device cpu)
DRY_RUN_BENCHES = {"train": ("train",), "host_ceiling": ("train", "--host-ceiling"),
                   "device_busy": ("train", "--device-busy")}


@dataclass
class DryRun:
    returncode: int
    stderr: str
    summary: dict


@pytest.fixture(scope="session")
def gpu_check_dry_run(tmp_path_factory) -> DryRun:
    out_dir = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(out_dir),
                          "--benches", ",".join(DRY_RUN_BENCHES)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=400)
    return DryRun(out.returncode, out.stderr, json.loads((out_dir / "gpu_check.json").read_text()))
