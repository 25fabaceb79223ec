"""The model's export runs off the trainer's poll loop: ``SnapshotPublisher.start_export`` exports on a thread of
its own, ``plan_next``/``publish`` build nothing (and return at once) while it runs, the first snapshot after it
carries the program a snapshot built by hand would carry, a failed export leaves program-less snapshots with the
same one error line, and a stop during the export waits for it (bounded, logged) and ends with the final model
pushed to a real in-process server and acknowledged. No broker: the stop runs ``TrainerService.push_final`` on a
host that holds only what it reads."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest
from torch import nn

import streamrec.snapshot as snapshot
from streamrec.app.wiring import server_settings
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.snapshot import read_manifest
from streamrec.trainer.changes import ChangeJournal
from streamrec.trainer.service import TrainerService
from streamrec.trainer.snapshots import SnapshotPublisher
from tests.helpers.serving import FakeTrainer

PROMPT_S = 1.0  # what "at once" allows a call on a loaded machine; the held export lasts until the test ends it


@pytest.fixture
def held_export(monkeypatch):
    """``export_dense`` held until the test sets ``release`` (``started`` is set when it begins): an export as
    slow as the test wants, on whichever thread runs it."""
    real, started, release = snapshot.export_dense, threading.Event(), threading.Event()

    def slow_export(*args, **kwargs):
        started.set()
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(snapshot, "export_dense", slow_export)
    yield SimpleNamespace(started=started, release=release)
    release.set()


@pytest.fixture
def trainer(cfg, tmp_path):
    t = FakeTrainer(cfg, tmp_path)
    t.store = ChangeJournal(t.store)
    t.step()
    yield t
    t.close()


def _publisher(cfg, out, **kw) -> SnapshotPublisher:
    return SnapshotPublisher(cfg.model, cfg.store, cfg.serving, out, model_hash=cfg.model_hash(), **{"push": False,
                             **kw})


def _publish(pub: SnapshotPublisher, trainer, version: int = 1):
    return pub.publish(version, 0, trainer.store, trainer.model, {}, {"auc": 0.5}, trainer.newest_event_ms)


def test_a_slow_export_holds_no_call_back_and_the_first_snapshot_after_it_carries_its_program(
        cfg, tmp_path, trainer, held_export):
    held_export.release.set()
    want_dir = _publish(_publisher(cfg, tmp_path / "by-hand"), trainer)  # exported on the caller's thread
    want = read_manifest(want_dir)
    held_export.release.clear()
    held_export.started.clear()

    pub = _publisher(cfg, tmp_path / "started")
    t0 = time.monotonic()
    pub.start_export(trainer.model)
    assert held_export.started.wait(30) and pub.exporting
    t1 = time.monotonic()
    assert pub.plan_next() is None and _publish(pub, trainer) is None  # no snapshot while the export runs
    assert pub.wait_export(0.05) is False
    assert t1 - t0 < PROMPT_S and time.monotonic() - t1 < PROMPT_S, "a call waited for the held export"
    assert not list((tmp_path / "started").glob("v*")) and pub.st.built == 0

    held_export.release.set()
    assert pub.wait_export(60) and not pub.exporting and pub.plan_next() == (True, None, 0)
    got_dir = _publish(pub, trainer)
    got = read_manifest(got_dir)
    assert got.program is not None and got.program["sha256"] == want.program["sha256"]
    assert got.program["probe_logits"] == want.program["probe_logits"]
    assert (got_dir / got.program["file"]).read_bytes() == (want_dir / want.program["file"]).read_bytes()
    assert got.files == want.files and not pub.program_error


class ValueDependent(nn.Module):
    """A branch on a tensor's value: torch.export refuses it."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, dense, pooled):
        out = self.inner(dense, pooled)
        return out * 2 if float(out.sum()) > 1e30 else out


def test_a_failed_export_on_its_thread_leaves_program_less_snapshots_and_the_same_one_line(
        cfg, tmp_path, trainer, caplog):
    trainer.model = ValueDependent(trainer.model).eval()
    with caplog.at_level(logging.ERROR):
        by_hand = _publish(_publisher(cfg, tmp_path / "by-hand"), trainer)
    want = [(r.name, r.getMessage()) for r in caplog.records if "no exported program" in r.getMessage()]
    caplog.clear()
    pub = _publisher(cfg, tmp_path / "started")
    with caplog.at_level(logging.ERROR):
        pub.start_export(trainer.model)
        assert pub.wait_export(60)
        snaps = [_publish(pub, trainer, v) for v in (1, 2)]
    got = [(r.name, r.getMessage()) for r in caplog.records if "no exported program" in r.getMessage()]
    assert read_manifest(by_hand).program is None and len(want) == 1 and "\n" not in want[0][1]
    assert got == want and want[0][0] == "streamrec.trainer.snapshots"  # one line, as from an export by hand
    assert all(s is not None and read_manifest(s).program is None for s in snaps)
    assert pub.program_error and "cannot be exported" in pub.program_error


class StoppingHost(TrainerService):
    """What ``TrainerService.push_final`` reads of a trainer (its settings' waits, the publisher, the journaled
    store, the model and counters), without a consumer: the stop path as a trainer runs it."""

    def __init__(self, cfg, trainer, pub: SnapshotPublisher, give_up_s: float):
        self.settings = SimpleNamespace(trainer=SimpleNamespace(push_give_up_s=give_up_s))
        self.publisher, self.store, self.offsets = pub, trainer.store, {("events", 0): 100}
        self.core = SimpleNamespace(model=trainer.model, events=100, newest_event_ms=trainer.newest_event_ms)
        self._pushed_events, self._pushed_version = -1, None

    def _metric_values(self) -> dict[str, float]:
        return {"auc": 0.5}

    def _evidence(self):
        return None


@pytest.mark.grpc
def test_a_stop_during_the_export_waits_for_it_and_ends_with_the_final_model_acknowledged(
        cfg, tmp_path, trainer, held_export, caplog):
    cfg.serving.push_token = "tok"
    server = serve(server_settings(cfg), device="cpu", port=0)
    cfg.serving.push_targets = server.target
    pub = _publisher(cfg, tmp_path / "snapshots", push=True, targets=cfg.push_targets(), backoff_s=0.05,
                     pusher_factory=SnapshotPusher.factory(cfg.serving))
    try:
        pub.start_export(trainer.model)
        assert held_export.started.wait(30)
        host, result = StoppingHost(cfg, trainer, pub, give_up_s=60.0), {}
        with caplog.at_level(logging.INFO, logger="streamrec.trainer.snapshots"):
            stop = threading.Thread(target=lambda: result.update(version=host.push_final()))
            stop.start()
            stop.join(1.0)
            assert stop.is_alive() and pub.st.built == 0  # the stop waits for the export, building nothing
            assert any("waiting up to 60 s for the model's export" in r.getMessage() for r in caplog.records)
            held_export.release.set()
            stop.join(60)
        assert not stop.is_alive() and result["version"] == 1, caplog.text
        with ServingClient(server.target) as c:
            st = c.status()
        assert int(st["version"]) == 1 and st["exported_program"] is True
        assert read_manifest(tmp_path / "snapshots" / "v000000001").program is not None
    finally:
        pub.close()
        server.stop(0.5)


def test_a_stop_gives_up_on_an_export_longer_than_its_wait_with_a_line(cfg, tmp_path, trainer, held_export,
                                                                     caplog):
    pub = _publisher(cfg, tmp_path / "snapshots")
    pub.start_export(trainer.model)
    assert held_export.started.wait(30)
    host = StoppingHost(cfg, trainer, pub, give_up_s=0.2)
    with caplog.at_level(logging.INFO):
        t0 = time.monotonic()
        assert host.push_final() is None
    assert time.monotonic() - t0 < 0.2 + PROMPT_S and pub.st.built == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the model's export is still running after 0.2 s" in m for m in lines), lines
