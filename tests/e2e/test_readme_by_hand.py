"""The README's "Run the parts by hand" commands, run exactly as written, end with a served prediction.

The commands are parsed from the README (between the by-hand markers), so the
documentation cannot rot: a renamed option or a changed default breaks this test.
Lines ending in ``&`` run in the background (the broker, serving, sketch and
trainer, as a user would start them) and are stopped by pid at the end, SIGTERM
then SIGKILL; the others must exit 0 (``predict`` is retried until the first
snapshot is served). The working directory is a fresh temporary one, so the
README's relative data directory starts empty.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.app.procs import pid_alive
from tests.helpers.shown_commands import run_foreground, start_background, stop

pytestmark = [pytest.mark.subprocess, pytest.mark.broker, pytest.mark.grpc]

README = Path(__file__).resolve().parents[2] / "README.md"


def by_hand_commands() -> list[tuple[list[str], bool]]:
    """``(argv, background)`` for each command line of the README's by-hand block."""
    text = README.read_text()
    m = re.search(r"<!-- by-hand:start -->\s*```bash\n(.*?)```\s*<!-- by-hand:end -->", text, re.S)
    assert m, "README.md has no by-hand block between <!-- by-hand:start --> and <!-- by-hand:end -->"
    out = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        background = line.endswith("&")
        argv = shlex.split(line.rstrip("&").strip())
        assert argv[0] == "streamrec", f"the by-hand block runs streamrec only: {line!r}"
        out.append(([sys.executable, "-m", "streamrec", *argv[1:]], background))
    return out


def _ports(commands) -> list[int]:
    ports = []
    for argv, _ in commands:
        for i, a in enumerate(argv):
            if a == "--port":
                ports.append(int(argv[i + 1]))
    return ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_readme_by_hand_commands_end_with_a_served_prediction(tmp_path):
    commands = by_hand_commands()
    names = [argv[3] for argv, _ in commands]
    assert names[:4] == ["broker", "serve", "sketch", "train"] and "predict" in names and "produce" in names
    for port in _ports(commands):
        if not _free(port):
            pytest.skip(f"port {port} of the README's commands is taken on this machine")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("STREAMREC_DATA_DIR", None)
    background: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        for argv, bg in commands:
            name = argv[3]
            log = tmp_path / f"{name}.log"
            if bg:
                background.append((name, start_background(name, argv, tmp_path, env, log), log))
                continue
            r = run_foreground(name, argv, tmp_path, env, background)
            if name == "produce":
                assert "produce starting:" in r.stderr and "brokers 127.0.0.1:" in r.stderr, r.stderr[-2000:]
            if name == "predict":
                rows = [json.loads(x) for x in r.stdout.splitlines()]
                assert len(rows) == 5 and all(0.0 < row["score"] < 1.0 and row["version"] >= 1 for row in rows)
            if name == "report":
                assert (tmp_path / "runs/by-hand/report.md").exists()
        # every long-running process said at start what it is connected to
        for name, _, log in background:
            assert f"{name} starting:" in log.read_text(), f"no start-up line from {name}:\n{log.read_text()[-2000:]}"
        # the data directory holds every part's state, nothing landed in the working directory's data/
        data = tmp_path / "runs/by-hand"
        assert {"store", "sketch", "checkpoints", "serving", "metrics.jsonl"} <= {p.name for p in data.iterdir()}
        assert not (tmp_path / "data").exists()
    finally:
        for name, proc, _ in reversed(background):  # the broker last: the others drain while it is up
            stop(proc)
    for name, proc, log in background:
        assert not pid_alive(proc.pid), f"{name} (pid {proc.pid}) still runs"
    train_log = next(log for name, _, log in background if name == "train").read_text()
    assert "Traceback" not in train_log, train_log[-3000:]
