"""`streamrec demo --delayed-feedback`: impressions and actions in, `streamrec join` in the pipeline, the trainer
trained on exactly the examples the join defines, the join's figures in the live view and the result."""

from __future__ import annotations

import json
import math
import subprocess
import uuid

import pytest

from streamrec.app.procs import pid_alive
from tests.conftest import HEAVY_GROUP
from tests.helpers.demo import demo_cmd

pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group(HEAVY_GROUP)]

EVENTS = 20_000


@pytest.mark.timeout(480)  # above its own wait: the demo run (420 s)
def test_demo_with_delayed_feedback_trains_on_the_joined_examples(bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:8]
    run_dir = tmp_path / "run"
    cmd = demo_cmd(run_dir, bootstrap, EVENTS, tag) + [
        "--delayed-feedback", "--rate", "2000",
        "--set", f"join.impressions_topic=imp-{tag}", "--set", f"join.actions_topic=act-{tag}",
        "--set", f"join.group=join-{tag}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"demo failed:\nstdout:{proc.stdout[-3000:]}\nstderr:{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    join = result["join"]
    ex = join["examples"]
    # window mode (the default): one example per impression, a positive when its click came in the window, else
    # a negative once the window closed; only windows the last actions did not close write nothing
    assert ex.get("fake_negative", 0) == 0 and ex["positive"] > 0 and ex["negative"] > 0, join
    assert 0.9 * EVENTS <= ex["positive"] + ex["negative"] <= EVENTS, join
    # the trainer stopped after exactly the examples the pure join defines for the produced stream, and the
    # joiner wrote exactly those
    assert result["join_expected_examples"] == ex["positive"] + ex["negative"], result
    assert result["events_trained"] == result["join_expected_examples"], result
    assert join["state_rows"] > 0 and join["label_delay_mean_s"] > 0, join
    assert result["served_version"] >= 1
    assert result["scores"] and all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in result["scores"])
    # the live view showed the join's figures while the stream ran
    views = [json.loads(x) for x in (run_dir / "view.jsonl").read_text().splitlines()]
    assert any((v.get("join") or {}).get("examples", {}).get("positive", 0) > 0 for v in views)
    assert "join examples (positive / negative / fake negative)" in proc.stderr
    pids = json.loads((run_dir / "logs" / "pids.json").read_text())
    assert set(pids) >= {"serving", "sketch", "join", "trainer"}
    assert not [n for n, p in pids.items() if pid_alive(p)], "demo left processes running"
