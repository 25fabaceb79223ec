"""Freshness decoupled from checkpoints, with the real processes: a trainer (`streamrec train`) on the
embedded broker pushes to a real serving endpoint; the served version advances several times before
the trainer's first durable checkpoint exists; killed with SIGKILL and restarted (from no checkpoint at
all), its pushes still land, under versions above everything served before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomli_w

from streamrec.ingest import EventProducer, EventSchema, SyntheticStream
from streamrec.serving import ServingClient, serve
from streamrec.app.wiring import server_settings
from tests.helpers.trainer import trainer_cfg

pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.grpc]


def _produce(cfg, bootstrap, stop: threading.Event, per_s: float = 2000.0):
    import numpy as np

    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for chunk in SyntheticStream(cfg).batches(10**7):
        for s in range(0, len(chunk), 256):
            if stop.is_set():
                prod.close()
                return
            b = chunk.take(np.arange(s, min(len(chunk), s + 256)))
            prod.send_batch(b)
            prod.flush()
            time.sleep(len(b) / per_s)
    prod.close()


def _wait_version(client, above: int, timeout: float, proc) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = client.status()
        if int(st.get("version", 0)) > above:
            return st
        assert proc.poll() is None, f"the trainer exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"served version stayed at {st.get('version')} (waited for > {above})"
        time.sleep(0.05)


def test_served_version_advances_between_checkpoints_and_after_a_kill(topics, tmp_path, bootstrap):
    cfg = trainer_cfg(topics, tmp_path)
    t = cfg.trainer
    t.checkpoint_every_events, t.checkpoint_every_s = 10**9, 3600.0  # no checkpoint during this test
    t.push_snapshots, t.idle_exit_s = True, 0.0
    cfg.serving.push_every_s = 0.3
    cfg.serving.push_token = "fresh-tok"
    # every pushed version served in turn: the test follows the versions the trainer pushes across a kill, and a
    # version the guard holds back by noise (its own tests) would be promoted later, out of that order
    cfg.serving.guard.enabled = False
    server = serve(server_settings(cfg), device="cpu", port=0)
    cfg.serving.push_targets = server.target
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--no-progress", "--log-level", "WARNING"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(cfg, bootstrap, stop), daemon=True)
    producer.start()
    client = ServingClient(server.target, timeout=10)
    procs = []
    try:
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first.log", "wb"))
        procs.append(first)
        st = _wait_version(client, 0, 120, first)
        v_first = int(st["version"])
        for _ in range(3):  # three more versions, each a delta on the one before
            st = _wait_version(client, int(st["version"]), 30, first)
            assert st["kind"] == "delta" and int(st["parent_version"]) < int(st["version"])
        assert not list(Path(t.checkpoint_dir).glob("ckpt-*")), "a checkpoint was written: not a test of pushes"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        v_killed = int(client.status()["version"])
        assert v_killed >= v_first + 3

        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "second.log", "wb"))
        procs.append(second)
        st = _wait_version(client, v_killed, 120, second)  # a full snapshot of the re-trained model, numbered above
        assert st["kind"] == "full"
        st = _wait_version(client, int(st["version"]), 30, second)
        assert st["kind"] == "delta"
        scores, version = client.predict(next(SyntheticStream(cfg).batches(8)).to_events())
        assert version >= int(st["version"]) and len(scores) == 8
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        client.close()
        server.stop(0.5)
        producer.join(10)
