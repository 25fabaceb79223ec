"""A restarted ``streamrec serve`` comes back serving the newest complete version it had
(from ``serving.data_dir``), skipping half-written or corrupt version directories, and
keeps accepting deltas on top of it. Also: the message size limit is gRPC's own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from serving_helpers import FakeTrainer, Touched, events_to_batch, make_events


class ServeProcess:
    """``streamrec serve`` as its own process; stderr collected for the log lines."""

    def __init__(self, data_dir: Path, hot_rows: int):
        env = dict(os.environ, STREAMREC_SERVING__DATA_DIR=str(data_dir), STREAMREC_SERVING__PUSH_TOKEN="tok",
                   STREAMREC_SERVING__HOT_ROWS=str(hot_rows), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--port", "0", "--device", "cpu"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.err: list[str] = []
        self._reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self._reader.start()
        self.target = self.proc.stdout.readline().strip()
        assert self.target, f"server did not start: {''.join(self.err)}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)


def test_restart_serves_newest_complete_version(cfg, tmp_path):
    data = tmp_path / "serving"
    trainer = FakeTrainer(cfg, tmp_path)
    events = make_events(cfg, 48, seed=5)
    batch = events_to_batch(cfg, events)
    touched = Touched()
    touched.add(trainer.step(n_rows=300))
    full = trainer.snapshot("full", [], touched.rows())
    changed = trainer.step(n_rows=300)
    touched.add(changed)
    delta = trainer.snapshot("delta", changed)
    want2 = trainer.scores(batch)

    srv = ServeProcess(data, hot_rows=400)  # rows split between memory and the store
    try:
        with SnapshotPusher(srv.target, token="tok") as p:
            assert p.push(full).ok and p.push(delta).ok
        with ServingClient(srv.target) as c:
            before, v = c.predict(events)
            rows_before = int(c.status()["rows_held"])
        assert v == 2 and np.max(np.abs(before - want2)) <= 1e-6
    finally:
        srv.kill()  # no clean shutdown

    versions = data / "versions"
    v2 = versions / "v000000000002"
    assert (v2 / "served.json").exists()
    half = versions / "v000000000009"  # a load that died half-way: no served.json
    shutil.copytree(v2, half)
    (half / "served.json").unlink()
    corrupt = versions / "v000000000007"  # complete-looking, but its dense weights were damaged
    shutil.copytree(v2, corrupt)
    blob = bytearray((corrupt / "dense.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (corrupt / "dense.safetensors").write_bytes(bytes(blob))

    srv = ServeProcess(data, hot_rows=400)
    try:
        with ServingClient(srv.target) as c:
            st = c.status()
            after, v = c.predict(events)
            assert st["serving"] and int(st["version"]) == 2 and int(st["rows_held"]) == rows_before
            assert v == 2 and np.array_equal(after, before)
            assert c.health() == "SERVING"
            # the chain goes on: a delta on top of the restored version is accepted
            changed = trainer.step(n_rows=300)
            with SnapshotPusher(srv.target, token="tok") as p:
                r = p.push(trainer.snapshot("delta", changed))
            assert r.ok and r.version == 3, r
            got3, v = c.predict(events)
            assert v == 3 and np.max(np.abs(got3 - trainer.scores(batch))) <= 1e-6
    finally:
        srv.stop()  # clean stop: the served version's directory stays
    log = "".join(srv.err)
    assert f"skipping version directory {half}: half-written" in log, log
    assert f"skipping version directory {corrupt}: SnapshotError: dense.safetensors: sha256" in log, log
    assert not half.exists() and not v2.exists()  # half-written and superseded ones are removed

    cfg.serving.data_dir = str(data)  # and an in-process server restores it too
    with serve(cfg, device="cpu") as s2, ServingClient(s2.target) as c:
        got, v = c.predict(events)
        assert v == 3 and np.array_equal(got, got3)
    trainer.close()


def test_message_limit_is_grpcs_own(cfg, tmp_path):
    cfg.serving.max_message_mb = 1
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    with serve(cfg, device="cpu") as srv, SnapshotPusher(srv.target) as p, ServingClient(srv.target) as c:
        assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        events = make_events(cfg, 8)
        big = dict(events[0], request_id="x" * (2 << 20))
        with pytest.raises(grpc.RpcError) as e:
            c.predict([big])
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.predict(events)[1] == 1  # still answers
    trainer.close()
