"""Scoring on a real gRPC server on 127.0.0.1: served scores equal the
trainer's, deltas apply on top of their parent, status/health/reflection answer,
and ``streamrec predict`` prints the same scores."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]

TOKEN = "push-secret"


@pytest.fixture
def server(cfg):
    cfg.serving.push_token = TOKEN
    srv = serve(server_settings(cfg), device="cpu")
    yield srv
    srv.stop(0.5)


@pytest.fixture
def trainer(cfg, tmp_path):
    t = FakeTrainer(cfg, tmp_path)
    yield t
    t.close()


def test_served_scores_equal_trainer_scores(cfg, server, trainer, tmp_path):
    events = make_events(cfg, 96)
    batch = events_to_batch(cfg, events)
    touched = Touched()
    client = ServingClient(server.target)
    pusher = SnapshotPusher(server.target, token=TOKEN, chunk_bytes=4096)  # many chunks per file
    assert client.health() == "NOT_SERVING"
    with pytest.raises(grpc.RpcError) as e:
        client.predict(events[:2])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    touched.add(trainer.step())
    r = pusher.push(trainer.snapshot("full", [], touched.rows()))
    assert r.ok and r.version == 1, r
    scores, version = client.predict(events)
    want = trainer.scores(batch)
    assert version == 1 and scores.shape == (96,)
    assert np.max(np.abs(scores - want)) <= 1e-6
    assert client.health() == "SERVING" and client.health("streamrec.v1.StreamRec") == "SERVING"

    changed = trainer.step()
    touched.add(changed)
    r = pusher.push(trainer.snapshot("delta", changed))
    assert r.ok and r.version == 2, r
    scores2, version2 = client.predict(events)
    want2 = trainer.scores(batch)
    assert version2 == 2
    assert np.max(np.abs(scores2 - want2)) <= 1e-6
    assert np.max(np.abs(scores2 - scores)) > 1e-4  # the delta really changed the model

    st = client.status()
    assert st["serving"] and int(st["version"]) == 2 and int(st["parent_version"]) == 1 and st["kind"] == "delta"
    assert st["metrics"]["auc"] == pytest.approx(0.52)
    assert st["freshness_s"] > 0 and int(st["newest_event_ms"]) == trainer.newest_event_ms
    assert int(st["rows_held"]) == sum(len(ids) for _, ids in touched.rows())  # exact: the delta's old rows once
    assert int(st["requests_served"]) == 2 and int(st["events_served"]) == 192

    # the CLI client prints the same scores
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events[:10]))
    out = subprocess.run([sys.executable, "-m", "streamrec", "predict", str(path), "--target", server.target],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(10)]
    assert all(r["version"] == 2 for r in rows)
    assert np.max(np.abs(np.array([r["score"] for r in rows]) - want2[:10])) <= 1e-6
    client.close()
    pusher.close()


def test_reflection_lists_the_services(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(server.target) as ch:
        services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert {"streamrec.v1.StreamRec", "grpc.health.v1.Health"} <= services
