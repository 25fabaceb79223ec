"""The CUDA paths: device choice, the hot tier on the device, a GPU trainer against the CPU
one on the same events, and a snapshot trained on the GPU served by a CPU server.

Every test here runs on ``STREAMREC_TEST_DEVICE`` (default ``cuda``) and skips with its
reason where that device is missing. ``scripts/gpu_check.sh`` runs them on a GPU;
``scripts/gpu_check.sh --dry-run`` runs the same logic with ``STREAMREC_TEST_DEVICE=cpu``,
so a test here cannot rot on machines without a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import hot_budget, resolve_device
from streamrec.ingest import EventBatch, SyntheticStream
from streamrec.trainer.core import TrainerCore
from tests.conftest import small_config

DEVICE = os.environ.get("STREAMREC_TEST_DEVICE", "cuda")
NEEDS = (f"needs a CUDA device (this machine has none; STREAMREC_TEST_DEVICE={DEVICE}); "
         "STREAMREC_TEST_DEVICE=cpu runs this test's logic on the CPU")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason=NEEDS),
]

BS = 256
WINDOW = BS * 4

# A GPU trainer against the CPU one: the same events, the same initial rows and weights, the same
# schedule. The two differ only in float summation order (cuBLAS tiling, atomics in index_add and
# embedding-bag backward), so after a few hundred Adagrad steps they agree to rounding, not bit for bit.
SCORE_ATOL = 2e-3  # progressive scores and held-out predictions, probabilities in [0, 1]
WEIGHT_ATOL = 2e-3  # dense weights and embedding rows


def _cfg(tmp_path, name: str):
    return small_config(tmp_path / name, **{"trainer.batch_size": BS, "hot.budget_rows": 4_000,
                                            "trainer.device": DEVICE})


def _events(cfg, n: int) -> EventBatch:
    s = SyntheticStream(cfg)
    return EventBatch.concat(list(s.batches(n)), cfg.model.dense_dim, cfg.model.field_names)


def _hot_set(batch: EventBatch, fields, per_field: int) -> dict[str, np.ndarray]:
    """The ``per_field`` most frequent ids of each field in ``batch``: a stand-in for the sketch's set."""
    hot = {}
    for f in fields:
        ids, counts = np.unique(batch.sparse[f].values, return_counts=True)
        hot[f] = ids[np.argsort(-counts, kind="stable")[:per_field]]
    return hot


def _train(cfg, device: torch.device, train: EventBatch, hot: dict) -> tuple[TrainerCore, EmbeddingStore, np.ndarray]:
    torch.manual_seed(0)  # the dense network's initial weights
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), device)
    core = TrainerCore(cfg.model, cfg.trainer, store, device, store_cfg=cfg.store, join=cfg.join)
    core.apply_hot_set(1, hot)
    scores = []
    for s in range(0, len(train), WINDOW):
        scores.append(core.feed(train.take(np.arange(s, min(len(train), s + WINDOW)))).scores)
    scores.append(core.flush().scores)
    return core, store, np.concatenate(scores)


def test_auto_device_and_placement(tmp_path):
    """``auto`` picks the GPU where there is one; the dense network and the hot rows live on it."""
    device = resolve_device(DEVICE)
    if DEVICE == "cuda":
        assert resolve_device("auto").type == "cuda"
    cfg = _cfg(tmp_path, "place")
    batch = _events(cfg, 2 * BS)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), device)
    try:
        core = TrainerCore(cfg.model, cfg.trainer, store, device, store_cfg=cfg.store, join=cfg.join)
        assert {p.device.type for p in core.model.parameters()} == {device.type}
        core.apply_hot_set(1, _hot_set(batch, cfg.model.field_names, 200))
        f = cfg.model.field_names[0]
        hot_ids = _hot_set(batch, [f], 200)[f]
        assert store.hot_mask(f, hot_ids).all()
        rows = store.lookup(f, hot_ids)
        assert rows.device.type == device.type and rows.shape == (len(hot_ids), cfg.model.embedding_dim)
        core.feed(batch)
        core.flush()
        assert core.events == len(batch)
        assert core.hot_events > 0  # hot mini-batches ran from the device tier alone
    finally:
        store.close()


def test_gpu_trainer_matches_cpu_trainer(tmp_path):
    """Same events, same hot set, same seeds: the trainer on ``DEVICE`` reaches the CPU trainer's state."""
    cfg_dev, cfg_cpu = _cfg(tmp_path, "dev"), _cfg(tmp_path, "cpu")
    cfg_cpu.trainer.device = "cpu"
    n_train, n_held = 12 * BS * 4, 2_000
    allb = _events(cfg_cpu, n_train + n_held)
    train, held = allb.take(np.arange(n_train)), allb.take(np.arange(n_train, n_train + n_held))
    hot = _hot_set(train, cfg_cpu.model.field_names, 300)

    core_c, store_c, scores_c = _train(cfg_cpu, torch.device("cpu"), train, hot)
    core_d, store_d, scores_d = _train(cfg_dev, resolve_device(DEVICE), train, hot)
    try:
        assert core_c.events == core_d.events == n_train
        assert core_c.hot_events == core_d.hot_events > 0
        ok = ~np.isnan(scores_c)
        assert ok.sum() > 0.8 * n_train and np.array_equal(ok, ~np.isnan(scores_d))
        assert np.max(np.abs(scores_c[ok] - scores_d[ok])) <= SCORE_ATOL

        for name, w in core_c.model.state_dict().items():
            diff = (w - core_d.model.state_dict()[name].cpu()).abs().max().item()
            assert diff <= WEIGHT_ATOL, (name, diff)
        for f in cfg_cpu.model.field_names:
            ids = np.unique(train.sparse[f].values)
            diff = (store_c.peek(f, ids) - store_d.peek(f, ids).cpu()).abs().max().item()
            assert diff <= WEIGHT_ATOL, (f, diff)

        pc, pd = core_c.predict(held), core_d.predict(held)
        assert np.max(np.abs(pc - pd)) <= SCORE_ATOL
        assert core_d.metrics.auc > 0.6  # it learned: the generated stream's AUC after ~12k events is ~0.7
    finally:
        store_c.close()
        store_d.close()


@pytest.mark.grpc
def test_snapshot_trained_on_gpu_serves_on_cpu(tmp_path):
    """A snapshot the trainer built on ``DEVICE`` loads into a CPU server, which scores as the trainer does."""
    from streamrec.serving import ServingClient, SnapshotPusher, serve
    from streamrec.app.wiring import server_settings
    from streamrec.trainer import SnapshotPublisher
    from tests.helpers.serving import events_to_batch, make_events

    cfg = _cfg(tmp_path, "snap")
    device = resolve_device(DEVICE)
    train = _events(cfg, 8 * BS)
    core, store, _ = _train(cfg, device, train, _hot_set(train, cfg.model.field_names, 300))
    publisher = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snapshots",
                                  model_hash=cfg.model_hash(), targets=cfg.push_targets(), push=False)
    srv = serve(server_settings(cfg), device="cpu")
    try:
        path = publisher.publish(1, 0, store, core.model, {}, {"auc": core.metrics.auc}, core.newest_event_ms,
                                 plan=(True, None, 0))
        assert path is not None
        with SnapshotPusher(srv.target) as pusher:
            r = pusher.push(path)
        assert r.ok and r.version == 1, r
        events = make_events(cfg, 200, id_range=cfg.generator.field(cfg.model.field_names[0]).cardinality)
        want = core.predict(events_to_batch(cfg, events))[:, 0]  # [B, tasks]: the first task's, as Predict's scores
        with ServingClient(srv.target) as client:
            got, version = client.predict(events)
        assert version == 1
        assert np.max(np.abs(got - want)) <= 1e-4  # same weights, CPU vs GPU float order at inference only
    finally:
        srv.stop(0.5)
        publisher.close()
        store.close()
