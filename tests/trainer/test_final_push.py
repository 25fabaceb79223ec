"""Every stop ends with the final model served: ``--max-events``, idle exit and SIGTERM (and the stream's end,
through the same path) wait for a push still pending, push the model the final checkpoint holds and wait for
serving's answer, on one process and on a trainer group (rank 0 publishes); the version a real server serves
afterwards holds every event of the final checkpoint. With serving down the stop does not sit out the retries."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from streamrec.benchmarks.final_push_lag import served_lag
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings, trainer_settings
from streamrec.trainer.service import TrainerService
from tests.helpers.group import run_group
from tests.helpers.trainer import produce, read_jsonl, trainer_cfg

pytestmark = [pytest.mark.broker, pytest.mark.grpc]

EVENTS = 5_000


class SlowPusher:
    """The real gRPC pusher, each push held back ``delay`` seconds first (a slow link to serving): a stop then
    finds the previous push still pending."""

    def __init__(self, target: str, cfg, delay: float):
        self.inner, self.delay = SnapshotPusher.factory(cfg.serving)(target), delay

    def push(self, snapshot_dir):
        time.sleep(self.delay)
        return self.inner.push(snapshot_dir)

    def close(self) -> None:
        self.inner.close()


def _cfg(topics, tmp_path, target: str):
    cfg = trainer_cfg(topics, tmp_path)
    cfg.trainer.push_snapshots, cfg.serving.push_targets = True, target
    cfg.serving.push_every_s = 0.2  # pushes between checkpoints, one pending most of the time
    cfg.trainer.max_events = EVENTS
    cfg.trainer.idle_exit_s = 0.0
    return cfg


def _served_holds_the_final_checkpoint(server, cfg, events: int) -> dict:
    """Serving's status; asserts the version it serves holds every event (and the offsets) of the final checkpoint."""
    with ServingClient(server.target) as c:
        st = c.status()
    lag = served_lag(st, cfg.trainer.checkpoint_dir, cfg.trainer.snapshot_dir)
    assert lag["checkpoint_events"] == events, lag
    assert lag["lag_events"] == 0 and lag["served_events"] == events, lag
    assert lag["offsets_match"] is True and lag["served_version"] == lag["newest_version"], lag
    return st


def _run_with_slow_pushes(cfg, bootstrap) -> tuple[TrainerService, dict]:
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False,
                         pusher_factory=lambda target: SlowPusher(target, cfg, delay=1.0))
    return svc, svc.run()


def test_max_events_ends_with_the_final_model_served_though_a_push_was_pending(topics, tmp_path, bootstrap):
    server = serve(server_settings(topics), device="cpu", port=0)
    try:
        cfg = _cfg(topics, tmp_path, server.target)
        produce(cfg, bootstrap, EVENTS)
        svc, res = _run_with_slow_pushes(cfg, bootstrap)
        assert res["reason"] == "max_events" and res["events"] == EVENTS
        st = _served_holds_the_final_checkpoint(server, cfg, EVENTS)
        # the served version is the newest built: the final one, acknowledged
        assert st["version"] == svc.publisher.version == svc._pushed_version
        assert svc._pushed_events == EVENTS
    finally:
        server.stop(0.5)


def test_idle_exit_ends_with_the_final_model_served_though_a_push_was_pending(topics, tmp_path, bootstrap):
    server = serve(server_settings(topics), device="cpu", port=0)
    try:
        cfg = _cfg(topics, tmp_path, server.target)
        cfg.trainer.max_events, cfg.trainer.idle_exit_s = 0, 1.0
        produce(cfg, bootstrap, EVENTS)
        svc, res = _run_with_slow_pushes(cfg, bootstrap)
        assert res["reason"] == "idle" and res["events"] == EVENTS
        st = _served_holds_the_final_checkpoint(server, cfg, EVENTS)
        assert st["version"] == svc._pushed_version
    finally:
        server.stop(0.5)


@pytest.mark.subprocess
def test_sigterm_to_streamrec_train_ends_with_the_final_model_served(topics, tmp_path, bootstrap):
    """A real ``streamrec train`` process, SIGTERM once it has trained part of its backlog: the version
    serving serves holds every event the final checkpoint's model was trained on, and its offsets."""
    server = serve(server_settings(topics), device="cpu", port=0)
    try:
        cfg = _cfg(topics, tmp_path, server.target)
        cfg.trainer.max_events = 0
        produce(cfg, bootstrap, EVENTS * 2)
        (tmp_path / "config.toml").write_text(tomli_w.dumps(cfg.to_dict()))
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        proc = subprocess.Popen([sys.executable, "-m", "streamrec", "train", "--config", str(tmp_path / "config.toml"),
                                 "--bootstrap", bootstrap, "--no-progress", "--log-level", "INFO"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while max((r["events"] for r in read_jsonl(Path(cfg.trainer.log_path))), default=0) < EVENTS // 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the trainer did not train its backlog"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-4000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["reason"] == "stopped" and EVENTS // 2 <= summary["events"] <= EVENTS * 2
        _served_holds_the_final_checkpoint(server, cfg, summary["events"])
        assert "is acknowledged by serving" in err
    finally:
        server.stop(0.5)


def _group_rank(rank, world, cfg, tmp):
    """A group's rank under ``max_events``; rank 0 pushes through a slow link."""
    from streamrec.trainer.group import GroupTrainerService

    pushers = (lambda target: SlowPusher(target, cfg, delay=1.0)) if rank == 0 else None
    svc = GroupTrainerService(trainer_settings(cfg), cfg.kafka.bootstrap, rank, world, pusher_factory=pushers)
    res = svc.run()
    return {"reason": res["reason"], "events": res["events"],
            "pushed": (svc._pushed_version, svc._pushed_events) if rank == 0 else None}


def _same(cfg, _tmp):
    return cfg


@pytest.mark.subprocess
def test_a_group_ends_with_the_final_model_served_though_a_push_was_pending(topics, tmp_path, bootstrap):
    server = serve(server_settings(topics), device="cpu", port=0)
    try:
        cfg = _cfg(topics, tmp_path, server.target)
        cfg.trainer.checkpoint_every_events = 10**9  # the final checkpoint only
        produce(cfg, bootstrap, EVENTS)
        ranks = run_group(2, functools.partial(_same, cfg), tmp_path, _group_rank)
        assert [r["reason"] for r in ranks] == ["max_events"] * 2 and ranks[0]["events"] == EVENTS
        st = _served_holds_the_final_checkpoint(server, cfg, EVENTS)
        assert ranks[0]["pushed"] == (st["version"], EVENTS)
    finally:
        server.stop(0.5)


def test_a_stop_with_serving_down_does_not_wait_out_the_retries(topics, tmp_path, bootstrap):
    from streamrec.ingest import free_port

    cfg = _cfg(topics, tmp_path, f"127.0.0.1:{free_port()}")  # nobody listens there
    cfg.trainer.push_give_up_s = 600.0
    produce(cfg, bootstrap, EVENTS)
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False, pusher_factory=SnapshotPusher.factory(cfg.serving))
    t0 = time.monotonic()
    res = svc.run()
    assert res["reason"] == "max_events" and res["events"] == EVENTS
    assert time.monotonic() - t0 < 120  # a failed attempt ends the wait; 600 s would be the retries' bound
