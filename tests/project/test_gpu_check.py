"""``scripts/gpu_check.sh --dry-run``: the GPU check's own steps on the CPU (its CUDA tests with
``STREAMREC_TEST_DEVICE=cpu``, the benches at ``--tiny``), so the check a GPU machine runs cannot rot."""

from __future__ import annotations

import json
import math

import pytest

from tests.project.conftest import DRY_RUN_BENCHES, GPU_CHECK_WORKER

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(420), GPU_CHECK_WORKER]


def test_gpu_check_dry_run(gpu_check_dry_run):
    out, summary = gpu_check_dry_run, gpu_check_dry_run.summary
    assert out.returncode == 0 and summary["ok"], (out.stderr[-3000:], json.dumps(summary)[:3000])
    assert summary["dry_run"] and summary["machine"]["device"] == "cpu"
    tests = summary["tests"]
    # every CUDA test ran its logic (none skipped on CPU) and the check names each one
    assert tests["passed"] >= 4 and tests["failed"] == tests["errors"] == tests["skipped"] == 0
    assert any("test_gpu_trainer_matches_cpu_trainer" in name for name in tests["cases"])
    assert any("test_cuda_hot_tier_matches_reference" in name for name in tests["cases"])
    # bench serve's --tiny run (the longest) is in tests/project/test_benches.py; the driver's bench step is one code path
    assert set(summary["benches"]) == set(DRY_RUN_BENCHES)
    for name, bench in summary["benches"].items():
        assert bench["rc"] == 0 and bench["result"]["device"] == "cpu", (name, bench.get("error"))
        assert "--tiny" in bench["command"] and "--device cpu" in bench["command"]
        figures = [v for v in bench["result"].values() if isinstance(v, float)]
        assert figures and all(math.isfinite(v) for v in figures), name
    # every GPU goal is named; those whose bench ran have a figure and a status, the others say so
    goals = {g["goal"]: g for g in summary["goals"]}
    assert goals["host ceiling <= 2 us/event"]["status"] in ("PASS", "FAIL")
    assert goals["Kafka Arrow backlog to trained >= 500 k events/s (batch 8192)"]["status"] == "not run"
    assert goals["FAE >= 3x all-in-store (batch 2048)"]["figure"] > 0
