"""Every architecture served by a real gRPC server on 127.0.0.1: a snapshot of a trained TrainerCore is
pushed and ``Predict`` answers the trainer's own scores; a user's module serves where serving can import
it, and a snapshot naming a module serving cannot import is refused (INVALID_ARGUMENT), the old version
still serving."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.snapshot import empty_evidence, rows_batch, write_snapshot
from tests.conftest import small_config
from tests.helpers.serving import events_to_batch, make_events
from tests.model.user_pkg import user_package

pytestmark = [pytest.mark.grpc]

TOKEN = "push-secret"


@pytest.fixture
def server(tmp_path):
    cfg = small_config(tmp_path / "server")
    cfg.serving.push_token = TOKEN
    srv = serve(server_settings(cfg), device="cpu")
    yield srv
    srv.stop(0.5)


def _trained(tmp_path, over: dict):
    """A TrainerCore after 2048 synthetic events, and the ids it trained, per field."""
    from streamrec.trainer.core import TrainerCore

    cfg = small_config(tmp_path / "trainer", **{"trainer.batch_size": 256, **over})
    events = EventBatch.concat(list(SyntheticStream(cfg).batches(2048)), cfg.model.dense_dim, cfg.model.field_names)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    core.feed(events)
    core.flush()
    trained = {f: np.unique(events.sparse[f].values) for f in cfg.model.field_names}
    return cfg, core, store, trained


def _snapshot(tmp_path, cfg, core, store, trained, version: int, model_config: dict | None = None):
    rows = [rows_batch(f, ids, store.peek(f, ids)) for f, ids in trained.items()]
    return write_snapshot(tmp_path / f"snap-{version}", version=version, parent_version=None, kind="full",
                          dense_state=core.model.state_dict(), rows=rows, kafka_offsets={"events:0": version},
                          metrics={"auc": float(core.metrics.auc)}, config_hash=cfg.model_hash(),
                          newest_event_ms=1_700_000_000_000 + version,
                          model_config=model_config or cfg.to_dict()["model"],
                          store_config={"init_scale": cfg.store.init_scale}, evidence=empty_evidence())


def _served_vs_trainer(server, cfg, core, events) -> tuple[float, int]:
    scores, version = ServingClient(server.target).predict(events)
    want = core.predict(events_to_batch(cfg, events))[:, 0]  # Predict's ``scores``: the first task's
    assert scores.shape == want.shape == (len(events),)
    return float(np.max(np.abs(scores - want))), version


@pytest.mark.parametrize("arch", ["dlrm", "dcn_v2", "deepfm", "mlp"])
def test_served_scores_equal_trainer_scores(tmp_path, server, arch):
    cfg, core, store, trained = _trained(tmp_path, {"model.architecture": arch, "model.cross_layers": 2})
    r = SnapshotPusher(server.target, token=TOKEN).push(_snapshot(tmp_path, cfg, core, store, trained, 1))
    assert r.ok and r.version == 1, r
    events = make_events(cfg, 96)  # trained ids, ids never seen, big and string ids, empty bags
    diff, version = _served_vs_trainer(server, cfg, core, events)
    assert version == 1 and diff <= 1e-6, (arch, diff)
    store.close()


def test_a_users_module_serves_where_serving_imports_it_and_is_refused_where_it_cannot(tmp_path, server):
    with user_package(tmp_path) as pkg:
        cfg, core, store, trained = _trained(tmp_path, {"model.module": f"{pkg}.ranking:build"})
        pusher = SnapshotPusher(server.target, token=TOKEN)
        r = pusher.push(_snapshot(tmp_path, cfg, core, store, trained, 1))
        assert r.ok and r.version == 1, r
        events = make_events(cfg, 64)
        diff, version = _served_vs_trainer(server, cfg, core, events)
        assert version == 1 and diff <= 1e-6
        served_v1 = ServingClient(server.target).predict(events)[0]

        model_config = dict(cfg.to_dict()["model"], module="streamrec_no_such_user_pkg.ranking:build")
        r = pusher.push(_snapshot(tmp_path, cfg, core, store, trained, 2, model_config=model_config))
        assert not r.ok and r.code == "INVALID_ARGUMENT", r
        assert "cannot import 'streamrec_no_such_user_pkg.ranking'" in r.reason
        assert "must be importable where serving runs" in r.reason
        scores, version = ServingClient(server.target).predict(events)
        assert version == 1 and np.array_equal(scores, served_v1)  # the old version keeps serving
        store.close()
