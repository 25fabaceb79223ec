"""Shared helpers for the serving tests: a stand-in 'trainer' that owns a real
EmbeddingStore and a DLRM, changes them, and writes full/delta snapshots; scoring
events; checks that a server still serves version 1; a raw PushSnapshot stream."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from streamrec.snapshot import empty_evidence, rows_batch, write_snapshot
from streamrec.model import DLRM, predict_batch
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings


class FakeTrainer:
    """Not a mock: real model, real RocksDB-backed store, real snapshot files."""

    def __init__(self, cfg, tmp_path, seed: int = 0):
        from streamrec.embedding_store import EmbeddingStore
        from streamrec.foundation import hot_budget

        self.cfg = cfg
        self.tmp = tmp_path
        self.fields = cfg.model.field_names
        self.model = DLRM.from_config(cfg.model).eval()
        self.store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                                  torch.device("cpu"), path=str(tmp_path / "trainer-store"))
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self.newest_event_ms = 1_700_000_000_000

    def step(self, n_rows: int = 200, id_range: int = 3000) -> list:
        """Change the dense weights and some rows, like a training step would; return the changed rows."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.from_numpy(self.rng.standard_normal(tuple(p.shape)).astype(np.float32)) * 0.05)
        changed = []
        for f in self.fields:
            ids = np.unique(self.rng.integers(0, id_range, n_rows).astype(np.int64))
            vecs = self.rng.standard_normal((len(ids), self.cfg.model.embedding_dim)).astype(np.float32) * 0.1
            self.store.upsert_rows(f, ids, torch.from_numpy(vecs))
            changed.append((f, ids))
        self.newest_event_ms += 1000
        return changed

    def snapshot(self, kind: str, changed: list, all_rows: list | None = None):
        """Write the next version; a delta carries ``changed`` rows, a full one ``all_rows``."""
        parent = self.version if self.version else None
        self.version += 1
        source = changed if kind == "delta" else all_rows
        rows = [rows_batch(f, ids, self.store.peek(f, ids)) for f, ids in source]
        return write_snapshot(
            self.tmp / f"snap-{self.version}", version=self.version, parent_version=parent if kind == "delta" else None,
            kind=kind, dense_state=self.model.state_dict(), rows=rows, kafka_offsets={"events:0": self.version * 100},
            metrics={"auc": 0.5 + self.version / 100, "logloss": 0.6}, config_hash=self.cfg.model_hash(),
            newest_event_ms=self.newest_event_ms, model_config=self.cfg.to_dict()["model"],
            store_config={"init_scale": self.cfg.store.init_scale}, evidence=empty_evidence())

    def scores(self, batch) -> np.ndarray:
        # the first task's probabilities [B]: what Predict's ``scores`` field carries
        return predict_batch(self.model, batch, self.fields, lambda f, ids: self.store.peek(f, ids), torch.device("cpu"))[:, 0]

    def close(self):
        self.store.close()


class Touched:
    """Accumulates every (table, ids) ever changed so a full snapshot can carry them all."""

    def __init__(self):
        self.ids: dict[str, set] = {}

    def add(self, changed):
        for f, ids in changed:
            self.ids.setdefault(f, set()).update(int(i) for i in ids)

    def rows(self):
        return [(f, np.array(sorted(s), dtype=np.int64)) for f, s in self.ids.items()]


def make_events(cfg, n: int = 64, seed: int = 3, id_range: int = 4000) -> list[dict]:
    """Scoring events: ids the trainer has rows for, ids it never saw, big and string ids, empty bags."""
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        sparse = {}
        for j, f in enumerate(cfg.model.fields):
            multi = cfg.generator.field(f.name).multi
            k = int(rng.integers(0, multi + 1)) if i % 7 == 0 else multi
            ids = [int(x) for x in rng.integers(0, id_range, k)]
            if i % 5 == 1 and ids:
                ids[0] = int(rng.integers(2**40, 2**62))
            if i % 9 == 2:
                ids.append(f"str-{i}-{j}")
            sparse[f.name] = ids
        events.append({"dense": [float(x) for x in rng.standard_normal(cfg.model.dense_dim)],
                       "sparse": sparse, "request_id": f"r{i}"})
    return events


def events_to_batch(cfg, events):
    """The trainer-side batch of the events: ingest's validation + hashing, jagged ids per field."""
    from streamrec.ingest import EventBatch, EventSchema, JaggedIds

    schema = EventSchema.from_sections(cfg.model, cfg.ingest, require_label=False)
    rows = [schema.validate(e) for e in events]
    return EventBatch(ts=np.array([r[0] for r in rows], np.int64), labels=np.zeros(len(rows), np.float32),
                      dense=np.array([r[2] for r in rows], np.float32).reshape(len(rows), cfg.model.dense_dim),
                      sparse={f: JaggedIds.from_lists([r[3][f] for r in rows]) for f in schema.fields})


def still_serving_v1(client, events, want):
    scores, version = client.predict(events)
    assert version == 1
    assert np.max(np.abs(scores - want)) <= 1e-6


def push_stream(target, chunks, token="push-tok"):
    """Send ``chunks`` as one raw PushSnapshot call that must be refused; returns the RpcError."""
    from streamrec.serving.pb import pb_grpc

    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.StreamRecStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.PushSnapshot(iter(list(chunks)), timeout=20, metadata=(("authorization", f"Bearer {token}"),))
    return e.value


def trained_once(cfg, tmp_path) -> tuple["FakeTrainer", object]:
    """A fake trainer after one step, and its first full snapshot (what most serving tests push first)."""
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    return trainer, trainer.snapshot("full", [], touched.rows())


def serving_version_1(cfg, tmp_path):
    """Start a server for ``cfg`` with push and predict tokens, push version 1; yield
    ``(server, trainer, touched, client, events, want)``, then stop it (the body of a fixture)."""
    cfg.serving.push_token = "push-tok"
    cfg.serving.predict_token = "pred-tok"
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    v1 = trainer.snapshot("full", [], touched.rows())
    srv = serve(server_settings(cfg), device="cpu")
    with SnapshotPusher(srv.target, token="push-tok") as p:
        assert p.push(v1).ok
    events = make_events(cfg, 20)
    want = trainer.scores(events_to_batch(cfg, events))
    client = ServingClient(srv.target, token="pred-tok")
    yield srv, trainer, touched, client, events, want
    client.close()
    srv.stop(0.5)
    trainer.close()
