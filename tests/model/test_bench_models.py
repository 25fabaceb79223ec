"""``streamrec bench quality --model NAME --json`` runs each built-in against its own independent reference and
keeps today's keys, with the architecture named in the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.subprocess
@pytest.mark.parametrize("model", ["dcn_v2", "deepfm", "mlp"])
def test_bench_quality_runs_each_architecture(model):
    cmd = [sys.executable, "-m", "streamrec", "bench", "quality", "--tiny", "--events", "1024", "--model", model,
           "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    syn = out["synthetic"]
    assert out["model"] == syn["model"] == model and syn["events"] == 1024
    for key in ("auc_trainer", "auc_reference", "auc_fae", "logloss_trainer", "logloss_reference", "goals"):
        assert key in syn, key
    assert 0.3 < syn["auc_trainer"] < 1 and 0.3 < syn["auc_reference"] < 1
    assert f"model {model}" in p.stdout


def test_an_unknown_model_is_a_usage_error():
    from streamrec.benchmarks.bench_quality import main

    with pytest.raises(SystemExit) as e:
        main(["--model", "dcn", "--tiny"])
    assert e.value.code == 2
