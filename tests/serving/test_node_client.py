"""An independent client: a Node.js script (@grpc/grpc-js + @grpc/proto-loader from
npm) loads the same .proto and gets the same scores as the Python client.

The set-up runs ``npm ci`` in tests/serving/node (committed package.json + package-lock.json)
when node_modules is missing. Skips only when node or npm is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from tests.helpers.serving import FakeTrainer, Touched, make_events

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]

NODE_DIR = Path(__file__).resolve().parent / "node"
PROTO = Path(__file__).resolve().parents[2] / "serving" / "streamrec.proto"


@pytest.fixture(scope="module")
def node_client():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip(f"Node.js client test needs node and npm on PATH (node={node}, npm={npm})")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists():
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"npm ci failed in {NODE_DIR}:\n{r.stderr[-2000:]}"
    return node


@pytest.mark.timeout(420)  # above its own waits: `npm ci` in the fixture (300 s) and the node client
def test_node_client_gets_python_scores(node_client, cfg, tmp_path):
    cfg.serving.predict_token = "node-tok"
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target) as p:
            assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        # ids JS can hold exactly (< 2**53) and string ids (hashed by the server)
        events = [e for e in make_events(cfg, 40) if all(not isinstance(i, int) or i < 2**53
                                                         for ids in e["sparse"].values() for i in ids)]
        assert len(events) >= 20
        with ServingClient(srv.target, token="node-tok") as c:
            py_scores, py_version = c.predict(events)
        r = subprocess.run([node_client, str(NODE_DIR / "predict.js"), srv.target, str(PROTO), "node-tok"],
                           input=json.dumps(events), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert int(out["version"]) == py_version == 1
        assert out["request_ids"] == [e["request_id"] for e in events]
        js = np.asarray(out["scores"], dtype=np.float32)
        assert js.shape == py_scores.shape and np.array_equal(js, py_scores)
        assert out["status"]["serving"] is True and int(out["status"]["version"]) == 1
        # without the token the Node client is refused
        r = subprocess.run([node_client, str(NODE_DIR / "predict.js"), srv.target, str(PROTO)],
                           input=json.dumps(events[:2]), capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Predict failed: 16" in r.stderr  # 16 = UNAUTHENTICATED
    finally:
        srv.stop(0.5)
        trainer.close()
