"""Every stop ends with the final model served: ``--max-events`` (and, through the same path, idle exit, the
stream's end and SIGTERM) waits for a push still pending, pushes the model the final checkpoint holds and
waits for serving's answer; with serving down the stop does not sit out the retries."""

from __future__ import annotations

import time

import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings, trainer_settings
from streamrec.trainer.service import TrainerService
from tests.helpers.trainer import produce, trainer_cfg

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


def test_max_events_ends_with_the_final_model_served_though_a_push_was_pending(topics, tmp_path, bootstrap):
    server = serve(server_settings(topics), device="cpu", port=0)
    try:
        cfg = _cfg(topics, tmp_path, server.target)
        produce(cfg, bootstrap, EVENTS)
        svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False,
                             pusher_factory=lambda target: SlowPusher(target, cfg, delay=1.0))
        res = svc.run()
        assert res["reason"] == "max_events" and res["events"] == EVENTS
        with ServingClient(server.target) as c:
            st = c.status()
        # the served version is the newest built, and it holds the final checkpoint's offsets: every event
        assert st["version"] == svc.publisher.version == svc._pushed_version
        assert svc._pushed_events == EVENTS
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
