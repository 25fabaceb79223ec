"""Lean tables end to end, trainer to a real gRPC server on 127.0.0.1: a TrainerCore trains with admission
and a row cap through its ChangeJournal, the publisher pushes full and delta snapshots, and serving holds
exactly the rows the trainer holds and scores every id (admitted, unadmitted, evicted) as the trainer does."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.embedding_store.store_types import UNADMITTED_ID
from streamrec.foundation import EventBatch, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.snapshot import DELETED
from streamrec.trainer.changes import ChangeJournal
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.snapshots import SnapshotPublisher
from tests.conftest import small_config
from tests.helpers.serving import events_to_batch, make_events

pytestmark = pytest.mark.grpc

TOKEN = "lean"


def _rows(snap) -> dict[str, set[int]]:
    m = json.loads((snap / "manifest.json").read_text())
    out: dict[str, set[int]] = {}
    for name in m["files"]:
        if name.startswith("rows-"):
            t = pq.read_table(str(snap / name), columns=["table", "id"])
            for table, i in zip(t.column("table").to_pylist(), t.column("id").to_pylist()):
                out.setdefault(table, set()).add(i)
    return out


@pytest.mark.parametrize("mode", ["shared", "zero"])
def test_serving_holds_what_the_trainer_admitted_and_drops_what_it_evicted(tmp_path, mode):
    cfg = small_config(tmp_path, **{"store.admit_min_count": 2, "store.unadmitted": mode, "store.max_rows": 400,
                                    "store.eviction": "lfu", "store.evict_slack": 0.0, "trainer.batch_size": 128,
                                    "serving.push_token": TOKEN})
    server = serve(server_settings(cfg), device="cpu", port=0)
    cfg.serving.push_targets = server.target
    store = ChangeJournal(EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu"))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    pub = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snaps",
                            model_hash=cfg.model_hash(), targets=cfg.push_targets(),
                            push=True, full_every=1000, backoff_s=0.05,
                            pusher_factory=SnapshotPusher.factory(cfg.serving))
    fields = cfg.model.field_names
    all_events = EventBatch.concat(list(SyntheticStream(cfg).batches(8 * 1024)), cfg.model.dense_dim, fields)
    stream = iter([all_events.take(np.arange(i * 1024, (i + 1) * 1024)) for i in range(8)])

    def push() -> tuple[int, object]:
        plan = pub.plan_next()
        rows, mark = store.snapshot_rows(plan)
        v = pub.reserve_version()
        snap = pub.publish(v, mark, None, core.model, {("events", 0): v}, {"auc": 0.5}, 1_700_000_000_000 + v,
                           plan=plan, rows=rows, deleted=store.last_deleted)
        assert pub.wait_idle(30), pub.st.last_error
        return v, snap

    def served_matches(events) -> None:
        scores, _ = ServingClient(server.target, timeout=10).predict(events)
        want = core.predict(events_to_batch(cfg, events))[:, 0]
        assert np.max(np.abs(scores - want)) <= 1e-6

    try:
        seen: dict[str, np.ndarray] = {}
        for _ in range(2):
            b = next(stream)
            core.feed(b, flush=True)
            for f in fields:
                seen[f] = np.concatenate([seen.get(f, np.zeros(0, np.int64)), b.sparse[f].values])
        v1, snap = push()
        held = _rows(snap)
        for f in fields:  # ids seen in only one training step have no row anywhere; every row is the trainer's
            ids, counts = np.unique(seen[f], return_counts=True)
            _, in_store = store.peek_held(f, np.array(sorted(held.get(f, ())), np.int64))
            assert in_store.all()
            assert (UNADMITTED_ID in held.get(f, ())) == (mode == "shared")
        once = [i for i, c in zip(*np.unique(seen["user"], return_counts=True)) if c == 1]
        assert once and not set(once) & held.get("user", set())
        served_matches(make_events(cfg, 64))

        gone: dict[str, np.ndarray] = {}
        for _ in range(6):  # more ids than the cap: sweeps delete rows serving holds
            core.feed(next(stream), flush=True)
            for t, ids in store.evict().items():
                gone[t] = np.union1d(gone.get(t, np.zeros(0, np.int64)), ids)
        assert sum(len(v) for v in gone.values()) > 0
        v2, snap2 = push()
        m = json.loads((snap2 / "manifest.json").read_text())
        assert m["kind"] == "delta" and m["deleted"] > 0 and DELETED in m["files"]
        st = ServingClient(server.target, timeout=10).status()
        assert int(st["version"]) == v2
        gone_now = {t: [int(i) for i in ids if not store.peek_held(t, np.array([i]))[1][0]]
                    for t, ids in gone.items()}
        evicted = [{"ts": 1, "dense": [0.0] * cfg.model.dense_dim, "sparse": {t: [i]}}
                   for t, ids in gone_now.items() for i in ids[:20]]
        assert evicted
        served_matches(evicted)  # an evicted id reads the unadmitted value on both sides
        served_matches(make_events(cfg, 64, seed=9))
        for t in fields:  # no table holds more rows than the cap after a sweep (the cap counts every tier)
            assert store.stats()["tables"][t]["rows_at_sweep"] <= 400
    finally:
        pub.close()
        store.close()
        server.stop(0.5)
