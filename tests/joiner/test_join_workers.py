"""``streamrec join --workers N``: N worker processes of one group on this machine, each with its own state
dir, supervised by the command: they split the partitions and write the undisturbed join's examples; a
signal to the command reaches every worker (SIGKILL after the grace period for one that ignores it); a
worker that dies stops the others and the command exits non-zero, naming it and its exit code."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from streamrec.app.commands import join as join_command
from streamrec.app.procs import pid_alive
from tests.helpers.waiting import wait_until
from tests.joiner.test_join_worker import P, STREAMREC, examples, join_config, joined_streams, produce
from tests.sketch.test_sketch_worker import write_config

pytestmark = pytest.mark.subprocess


def _args(grace: float = 5.0) -> argparse.Namespace:
    return argparse.Namespace(config=None, data_dir=None, overrides=["join.window_s=5"], log_level="INFO",
                              log_format="text", faust_log_level="warning", stop_grace_s=grace)


def test_worker_argv_gives_each_worker_its_state_dir_and_metrics_port(tmp_path):
    argv = join_command.worker_argv(_args(), "127.0.0.1:1", tmp_path, 9300, 2)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets == ["join.window_s=5", f"join.state_dir={tmp_path / 'worker-2'}", "join.metrics_port=9302"]
    assert argv[argv.index("--bootstrap") + 1] == "127.0.0.1:1" and "--workers" not in argv
    assert not any(s.startswith("join.metrics_port") for s in
                   [argv[i + 1] for i, a in enumerate(join_command.worker_argv(_args(), "b", tmp_path, 0, 1))
                    if a == "--set"])


def _fake_workers(monkeypatch, programs: list[str]) -> None:
    """``run_workers`` starts ``python -c programs[i]`` as worker ``i``."""
    monkeypatch.setattr(join_command, "worker_argv",
                        lambda args, bootstrap, state_dir, port, i: [sys.executable, "-c", programs[i]])


def test_a_dead_worker_stops_the_others_and_fails_the_command(tmp_path, monkeypatch, capsys):
    _fake_workers(monkeypatch, ["import time; time.sleep(60)", "import time, sys; time.sleep(0.5); sys.exit(3)"])
    t0 = time.monotonic()
    assert join_command.run_workers(_args(), "b", tmp_path, 0, 2) == 1
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert "worker-1" in err and "exited with code 3" in err, err
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert not pid_alive(pids["worker-0"])


def test_a_signal_reaches_every_worker_and_one_that_ignores_it_is_killed(tmp_path, monkeypatch):
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    stops = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); print('up', flush=True); time.sleep(60)"
    _fake_workers(monkeypatch, [ignores, stops])

    def send_sigterm_when_up():
        wait_until(lambda: all((tmp_path / f"worker-{i}.log").exists() and "up" in
                               (tmp_path / f"worker-{i}.log").read_text() for i in range(2)), 30, "the workers")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send_sigterm_when_up, daemon=True).start()
    t0 = time.monotonic()
    assert join_command.run_workers(_args(grace=1.0), "b", tmp_path, 0, 2) == 0
    assert time.monotonic() - t0 < 30
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert not any(pid_alive(p) for p in pids.values())


@pytest.mark.broker
def test_two_workers_split_the_partitions_and_write_the_oracles_examples(topics, bootstrap, tmp_path):
    cfg = join_config(topics, "fake_negative")
    cfg.join.batch_records = 9
    cfg.join.state_dir = str(tmp_path / "join")
    r, imps, acts, want = joined_streams(bootstrap, cfg, 9, n=200)
    produce(bootstrap, cfg, imps, acts)
    log = tmp_path / "join.log"
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(write_config(cfg, tmp_path / "j.toml")),
                             "--bootstrap", bootstrap, "--workers", "2", "--stop-grace-s", "20"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: sum(examples(bootstrap, cfg, r).values()) >= sum(want.values()) or proc.poll() is not None,
                   120, "the two workers' examples", interval=1.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(2)  # nothing more arrives
        assert examples(bootstrap, cfg, r) == want

        def restored() -> list[set[int]]:
            return [{p for p in range(P) if f"partition {p}: join state restored" in
                     (tmp_path / "join" / f"worker-{i}.log").read_text()} for i in range(2)]

        wait_until(lambda: all(restored()), 60, "each worker owning a partition", interval=0.5)
        assert set().union(*restored()) == set(range(P))
        assert all((tmp_path / "join" / f"worker-{i}").is_dir() for i in range(2))
        pids = json.loads((tmp_path / "join" / "pids.json").read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert not any(pid_alive(p) for p in pids.values())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
