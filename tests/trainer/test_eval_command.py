"""``streamrec eval FILE``: the file through the real trainer (embedded broker) and through the independent
reference, both progressive AUCs and loglosses printed; bad input is one clear line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.e2e]


def _streamrec(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "streamrec", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(660)  # above its own waits: `generate` and `eval` runs of up to 300 s each
def test_eval_prints_both_models_over_every_event(tmp_path):
    data = tmp_path / "events.parquet"
    small = ["--set", 'generator.fields=[{"name":"user","cardinality":3000},{"name":"item","cardinality":1000},'
                      '{"name":"category","cardinality":50},{"name":"tags","cardinality":300,"multi":2}]']
    assert _streamrec("generate", "--events", "12000", "--out", str(data), *small).returncode == 0
    r = _streamrec("eval", str(data), "--seeds", "2", "--set", "trainer.batch_size=256", "--set",
                   "trainer.hot_source=none", "--log-level", "WARNING")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["events_scored_trainer"] == out["events_scored_reference"] == out["events"] == 12_000
    assert "progressive auc" in r.stdout and "progressive logloss" in r.stdout
    for k in ("auc_trainer", "auc_reference"):
        # both learnt from 12k events: measured 0.571..0.649 over model seeds, the floor 0.02 below the lowest
        assert 0.55 < out[k] < 1.0, out
    # on 12k events one model seed moves either AUC by up to +-0.04 (measured 0.571..0.649): the bound on the
    # difference of the two seed-averaged AUCs is that spread plus a margin of 0.02
    assert abs(out["auc_trainer"] - out["auc_reference"]) < 0.06, out
    assert abs(out["logloss_trainer"] - out["logloss_reference"]) < 0.03, out
    assert len(out["per_seed"]["trainer"]) == len(out["per_seed"]["reference"]) == 2


def test_eval_of_a_missing_file_is_one_clear_line(tmp_path):
    r = _streamrec("eval", str(tmp_path / "nope.parquet"), timeout=60)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "nope.parquet" in (r.stderr + r.stdout)
