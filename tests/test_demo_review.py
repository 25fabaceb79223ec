"""`streamrec demo` / `streamrec report` on short, empty or odd runs. Each test failed before its fix."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from streamrec.app.cli import main
from tests.test_demo import _demo_cmd


@pytest.mark.parametrize("events", ["-3", "0"])
def test_demo_refuses_negative_events(tmp_path, capsys, events):
    """--events -3 started the broker and every process, then failed with the sketch's
    'trainer.max_events: must be >= 0', a key the user never set; --events 0 without
    --data silently ran the default 300,000 events."""
    code = main(["demo", "--events", events, "--run-dir", str(tmp_path / "run"), "--no-live"])
    assert code == 2
    assert "--events" in capsys.readouterr().err


def test_demo_over_a_file_without_events_fails_fast_and_says_why(bootstrap, tmp_path):
    """With no event trained there is never a snapshot: the demo waited for one until --timeout (900 s by
    default) and then said 'served version None never reached 0'."""
    data = tmp_path / "empty.csv"
    data.write_text("label,dense_0,dense_1,dense_2,dense_3,user\n")
    run_dir = tmp_path / "run"
    cmd = _demo_cmd(run_dir, bootstrap, 0)
    cmd[cmd.index("--events"):cmd.index("--events") + 2] = ["--data", str(data)]
    cmd[cmd.index("--timeout") + 1] = "120"
    t0 = time.monotonic()
    proc = subprocess.run(cmd + ["--set", "trainer.idle_exit_s=1"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["error"] == "demo failed"
    assert "no events" in proc.stderr and "never reached" not in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 100


def test_report_skips_records_it_cannot_read(tmp_path):
    """A metrics line that is JSON but not an object, or a log without 'ts', raised AttributeError /
    ValueError out of `streamrec report`; a view record with "t": null raised TypeError."""
    from streamrec.app.report import write_report

    (tmp_path / "metrics.jsonl").write_text('[1, 2]\n{"events": 10, "auc": 0.6}\n')
    (tmp_path / "view.jsonl").write_text('{"t": null, "served_version": 1}\n')
    png, md = write_report(tmp_path)
    assert png.exists() and "| events trained | 10 |" in md.read_text()
