"""The whole pipeline as a new user runs it: `streamrec demo`, real processes end to end."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import HEAVY_GROUP

# one xdist worker runs the demo runs and the group kill test one after another (conftest.HEAVY_GROUP)
pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group(HEAVY_GROUP)]

from streamrec.app.procs import pid_alive
from tests.helpers.demo import SCRAPED_DEMO_EVENTS, demo_cmd

DEMO_EVENTS = 40_000


def _demo_cmd(run_dir: Path, bootstrap: str, events: int) -> list[str]:
    return demo_cmd(run_dir, bootstrap, events)  # unique topics and groups on the shared test broker


def _pids(run_dir: Path) -> dict[str, int]:
    p = run_dir / "logs" / "pids.json"
    return json.loads(p.read_text()) if p.exists() else {}


# above its own waits: the shared demo (tests/helpers/demo.py: up to 240 s to come up, 60 s between scrapes, 420 s
# to finish) and the two-trainer demo (420 s)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("trainers", [1, 2])
def test_demo_end_to_end(bootstrap, tmp_path, trainers, request):
    """One trainer, and a group of two trainer ranks (torchrun) with two sketch workers.

    The one-trainer run is the session's shared demo (``scraped_demo``, tests/helpers/demo.py: 60k events
    at 2,000/s, its /metrics pages scraped mid-run by test_metrics_endpoints.py) rather than a second one."""
    from streamrec.ingest import SyntheticStream
    from streamrec.app.config import load_config

    if trainers == 1:
        demo = request.getfixturevalue("scraped_demo")
        run_dir, events, proc = demo.run_dir, SCRAPED_DEMO_EVENTS, demo
    else:
        run_dir, events = tmp_path / f"run{trainers}", DEMO_EVENTS
        cmd = _demo_cmd(run_dir, bootstrap, events) + ["--trainers", str(trainers)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"demo failed:\nstdout:{proc.stdout[-3000:]}\nstderr:{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["served_version"] >= 1
    assert result["events_trained"] >= events
    bayes = SyntheticStream(load_config(run_dir / "config.toml", env={})).bayes_auc(20_000)
    # progressive AUC since the first event (cold start included) and over the last window, against floors set from
    # the generator's Bayes-optimal AUC (~0.84 here: floors ~0.60 and ~0.67); the demo measures 0.66-0.72 and
    # 0.74-0.75 (README; a two-trainer run on 40k events)
    assert result["auc"] is not None and result["auc"] > 0.5 + 0.3 * (bayes - 0.5), (result, bayes)
    assert result["window_auc"] is not None and result["window_auc"] > 0.5 + 0.5 * (bayes - 0.5), (result, bayes)
    assert result["scores"] and all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in result["scores"])
    pids = _pids(run_dir)
    assert set(pids) >= {"serving", "sketch", "trainer"} | ({"sketch-2"} if trainers > 1 else set())
    assert not [n for n, p in pids.items() if pid_alive(p)], "demo left processes running"
    assert (run_dir / "report.png").exists() and (run_dir / "report.md").exists()
    # the served model judged from outside: held-out events through Predict, next to their Bayes-optimal AUC
    # the served model measures 0.745 with two trainers on 40k events and 0.77-0.79 with one on 60k, against a
    # Bayes-optimal 0.84: the floor, 60% of the way from chance to Bayes (~0.705), is 0.04-0.08 below those
    served_floor = 0.5 + 0.6 * (result["bayes_auc"] - 0.5)
    assert served_floor < result["served_auc"] <= result["bayes_auc"] + 0.03, (served_floor, result)
    assert result["predict_latency_ms"]["p50"] > 0
    # by the Kafka clock; the one-trainer demo's stream is sampled while it runs, and 30 s is the product's
    # freshness goal for the demo (README and BENCHMARKS.md give the measured medians). The two-trainer run's
    # stream is short and ends before its first model is served, so its one sample is the pipeline's cold start
    # (start-ups, first checkpoint, first snapshot served), which a loaded machine stretches past that goal: it
    # is bounded by the demo's own waits instead
    bound = 30 if trainers == 1 else 120
    assert result["freshness_s_median"] is not None and result["freshness_s_median"] < bound, result
    report = (run_dir / "report.md").read_text()
    for line in ("## Run settings", "Bayes-optimal AUC", "served model's AUC", "Predict latency", "consumer lag",
                 "since the event entered Kafka"):
        assert line in report, report


@pytest.mark.parametrize("victim", ["sketch"])
def test_demo_stops_everything_when_a_child_dies(bootstrap, tmp_path, victim):
    run_dir = tmp_path / "run2"
    proc = subprocess.Popen(_demo_cmd(run_dir, bootstrap, 5_000_000), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # every child up (the stop must reach the others), then the victim dies
        while not {"serving", "sketch", "trainer"} <= {n for n, p in _pids(run_dir).items() if pid_alive(p)}:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the demo never started its children: {_pids(run_dir)}"
            time.sleep(0.2)
        os.kill(_pids(run_dir)[victim], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode not in (0, None)
    assert f"'{victim}'" in err and "exited" in err, err[-3000:]
    pids = _pids(run_dir)
    assert not [n for n, p in pids.items() if pid_alive(p)], "demo left processes running"


@pytest.mark.timeout(420)  # above its own wait: the demo run (300 s)
def test_demo_replays_a_file(bootstrap, tmp_path):
    """`--data FILE`: the file's events are streamed, trained on, and the served model scores its tail."""
    from streamrec.ingest import EventSchema, SyntheticStream, write_events
    from streamrec.app.config import load_config

    data = tmp_path / "events.jsonl"
    cfg = load_config(None, env={})
    write_events(data, SyntheticStream(cfg).batches(12_000), EventSchema.from_sections(cfg.model, cfg.ingest))
    run_dir = tmp_path / "run3"
    cmd = _demo_cmd(run_dir, bootstrap, 0)
    i = cmd.index("--events")
    cmd[i:i + 2] = ["--data", str(data), "--set", "trainer.idle_exit_s=4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"demo failed:\nstdout:{proc.stdout[-3000:]}\nstderr:{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["events_trained"] == 12_000
    assert result["served_version"] >= 1
    assert len(result["scores"]) == 5 and all(math.isfinite(s) for s in result["scores"])
    assert not [n for n, p in _pids(run_dir).items() if pid_alive(p)]


def test_demo_over_a_file_without_events_fails_fast_and_says_why(bootstrap, tmp_path):
    """A file without events gives no snapshot ever: the demo fails before it starts a process, saying there are
    no events, rather than waiting until --timeout (900 s by default) to say 'served version None never reached
    0'. (A file whose every record is dead-lettered fails when the trainer exits:
    tests/project/test_demo_and_report_inputs.py.)"""
    data = tmp_path / "empty.csv"
    data.write_text("label,dense_0,dense_1,dense_2,dense_3,user\n")
    run_dir = tmp_path / "run"
    cmd = _demo_cmd(run_dir, bootstrap, 0)
    cmd[cmd.index("--events"):cmd.index("--events") + 2] = ["--data", str(data)]
    cmd[cmd.index("--timeout") + 1] = "120"
    proc = subprocess.run(cmd + ["--set", "trainer.idle_exit_s=1"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["error"] == "demo failed"
    # it stops on the missing events, not on its --timeout (whose message is "never reached")
    assert "no events" in proc.stderr and "never reached" not in proc.stderr, proc.stderr[-3000:]
    assert "Kafka at" not in proc.stderr and not list((run_dir / "logs").iterdir())  # nothing was started
