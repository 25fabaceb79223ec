"""The README's "Bring your own model" section, run as written: its module, its config and its commands.

The module and the config are taken from the README (between the byom markers) into a fresh working
directory, so the example a user copies is the one that is tested. Only the trainer has the module on
its path (the README's ``PYTHONPATH=.`` prefix); the server runs from another directory without it and
still serves the model, from the exported program in the snapshot. The last command must print a score
per task for every held-out event.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.app.procs import pid_alive
from tests.helpers.shown_commands import run_foreground, start_background, stop

pytestmark = [pytest.mark.subprocess, pytest.mark.broker, pytest.mark.grpc, pytest.mark.e2e]

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _block(name: str, lang: str) -> str:
    m = re.search(rf"<!-- byom-{name}:start -->\s*```{lang}\n(.*?)```\s*<!-- byom-{name}:end -->", README, re.S)
    assert m, f"README.md has no byom-{name} block"
    return m.group(1)


def _file(name: str, lang: str) -> tuple[str, str]:
    """``(path, text)`` of a README block whose first line is ``# path``."""
    text = _block(name, lang)
    first, _, _ = text.partition("\n")
    assert first.startswith("# "), f"the byom-{name} block starts with '# <path>': {first!r}"
    return first[2:].strip(), text


def commands() -> list[tuple[dict[str, str], list[str], bool]]:
    """``(environment assignments, argv, background)`` per command line of the README's byom-run block."""
    out = []
    for line in _block("run", "bash").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        background = line.endswith("&")
        argv = shlex.split(line.rstrip("&").strip())
        env = {}
        while "=" in argv[0] and argv[0].split("=", 1)[0].isupper():
            k, v = argv.pop(0).split("=", 1)
            env[k] = v
        assert argv[0] == "streamrec", line
        out.append((env, [sys.executable, "-m", "streamrec", *argv[1:]], background))
    return out


def test_readme_own_model_is_trained_from_kafka_and_served_without_its_code(tmp_path):
    work = tmp_path / "work"
    module_path, module = _file("module", "python")
    config_path, config = _file("config", "toml")
    (work / module_path).parent.mkdir(parents=True)
    (work / module_path).write_text(module)
    (work / config_path).write_text(config)
    # serving runs elsewhere: no module, and a config path that is not needed there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMREC_DATA_DIR")}
    base_env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmds = commands()
    names = [argv[3] for _, argv, _ in cmds]
    assert names[:3] == ["broker", "serve", "train"] and names[-1] == "predict"
    background: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        for extra, argv, bg in cmds:
            name = argv[3]
            cwd = work
            if name == "serve":  # another directory: the module cannot be found from there
                cwd = elsewhere
                argv = [a if a != "runs/byom" else str(work / "runs/byom") for a in argv]
            env = dict(base_env, **{k: str((work / v).resolve()) if k == "PYTHONPATH" else v for k, v in extra.items()})
            if bg:
                log = tmp_path / f"{name}.log"
                background.append((name, start_background(name, argv, cwd, env, log), log))
                continue
            r = run_foreground(name, argv, cwd, env, background)
            if name == "generate":
                held = [json.loads(x) for x in (work / "runs/byom/held-out.jsonl").read_text().splitlines()]
                assert len(held) == 5
            if name == "predict":
                rows = [json.loads(x) for x in r.stdout.splitlines()]
                assert len(rows) == 5, r.stdout
                for row in rows:
                    assert set(row["scores"]) == {"click", "conversion"}, row
                    assert all(0.0 < s < 1.0 for s in row["scores"].values()), row
                    assert row["score"] == row["scores"]["click"] and row["version"] >= 1, row
        serve_log = next(log for n, _, log in background if n == "serve").read_text()
        assert "ranking" not in sys.modules and "Traceback" not in serve_log, serve_log[-3000:]
    finally:
        for _, proc, _ in reversed(background):  # the broker last
            stop(proc)
    for name, proc, _ in background:
        assert not pid_alive(proc.pid), f"{name} (pid {proc.pid}) still runs"
    train_log = next(log for n, _, log in background if n == "train").read_text()
    assert "Traceback" not in train_log, train_log[-3000:]
