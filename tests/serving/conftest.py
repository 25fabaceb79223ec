"""Fixtures for the serving tests."""

from __future__ import annotations

import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events


@pytest.fixture
def loaded(cfg, tmp_path):
    """A server with push and predict tokens, serving version 1; plus the trainer and events."""
    cfg.serving.push_token = "push-tok"
    cfg.serving.predict_token = "pred-tok"
    cfg.serving.max_batch = 50
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    v1 = trainer.snapshot("full", [], touched.rows())
    srv = serve(cfg, device="cpu")
    with SnapshotPusher(srv.target, token="push-tok") as p:
        assert p.push(v1).ok
    events = make_events(cfg, 20)
    want = trainer.scores(events_to_batch(cfg, events))
    client = ServingClient(srv.target, token="pred-tok")
    yield srv, trainer, touched, client, events, want
    client.close()
    srv.stop(0.5)
    trainer.close()
