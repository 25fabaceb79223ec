"""Serving verifies what it keeps: every file of a stored version (``serving.data_dir/versions/v<N>/``) is
recorded with its size and sha256 at install, its store is opened read-only, and the record is checked at
every start and before a delta is applied on it. A flipped byte in any stored file is never answered from:
the delta on it is refused with DATA_LOSS naming the file (then a full snapshot is served), a restart
serves the newest older version that verifies or is NOT_SERVING saying why, and a serving group's process
restarted over damaged files does not answer from them. Real gRPC on loopback, real RocksDB files."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from streamrec.app.config import save_config
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.serving.siblings import read_group_file
from streamrec.snapshot import needs_full
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events

pytestmark = [pytest.mark.grpc]


def vdir_of(cfg, version: int, proc: int | None = None) -> Path:
    root = Path(cfg.serving.data_dir) if proc is None else Path(cfg.serving.data_dir) / f"proc-{proc}"
    return root / "versions" / f"v{version:012d}"


def biggest_sst(vdir: Path) -> str:
    """The relative path of the version's largest RocksDB table file (where its rows are)."""
    ssts = sorted(vdir.glob("store/shard-*/*.sst"), key=lambda p: p.stat().st_size)
    assert ssts, f"no SST file under {vdir}/store"
    return ssts[-1].relative_to(vdir).as_posix()


def flip_byte(path: Path, at: float = 0.1) -> None:
    """One bit rotted at fraction ``at`` of the file; its size stays. At 0.1 of a table file the bit lands in
    row data that RocksDB reads back without complaint: only serving's own check stands between it and
    wrong scores."""
    blob = bytearray(path.read_bytes())
    blob[int(len(blob) * at)] ^= 0x01
    path.write_bytes(bytes(blob))


def unavailable(client: ServingClient, events) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        client.predict(events)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    return e.value


def test_every_recorded_file_of_a_stored_version_is_checked(cfg, tmp_path):
    """A byte flipped in any one recorded file (dense weights, manifest, memory-row ids, each RocksDB file),
    a removed file, or an unrecorded file next to them: the version is refused naming that file."""
    from streamrec.serving.version import SERVED, StoredVersionDamaged, restore_version

    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step(n_rows=300))
    full = trainer.snapshot("full", [], touched.rows())
    changed = trainer.step(n_rows=300)
    delta = trainer.snapshot("delta", changed)
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target) as p:
        assert p.push(full).ok and p.push(delta).ok
        v2 = srv.service.current
        assert v2.version == 2 and v2.store.read_only  # installed: never written again
        assert v2.verify()[0] == sum(i["bytes"] for i in v2.files.values()) > 0
    good = vdir_of(cfg, 2)
    recorded = json.loads((good / SERVED).read_text())["files"]
    assert {"dense.safetensors", "manifest.json", "memory-ids.npz", "store/manifest.json"} <= set(recorded)
    assert any(f.endswith(".sst") for f in recorded) and any("/MANIFEST-" in f for f in recorded)
    device = srv.device
    restore_version(good, cfg.store, device).retire(keep_dir=True)  # intact: it opens (read-only)
    for i, name in enumerate(sorted(recorded)):
        bad = tmp_path / f"bad-{i}"
        shutil.copytree(good, bad)
        if recorded[name]["bytes"]:
            flip_byte(bad / name)
        else:  # an empty file: a byte appended
            (bad / name).write_bytes(b"\0")
        with pytest.raises(StoredVersionDamaged) as e:
            restore_version(bad, cfg.store, device)
        assert e.value.file == name and e.value.code == "DATA_LOSS" and name in str(e.value)
        shutil.rmtree(bad)
    gone = tmp_path / "gone"
    shutil.copytree(good, gone)
    sst = biggest_sst(gone)
    (gone / sst).unlink()
    with pytest.raises(StoredVersionDamaged, match=f"{sst}: missing"):
        restore_version(gone, cfg.store, device)
    extra = tmp_path / "extra"  # a WAL that RocksDB would replay as rows
    shutil.copytree(good, extra)
    (extra / "store" / "shard-000" / "999999.log").write_bytes(b"x" * 64)
    with pytest.raises(StoredVersionDamaged, match="999999.log: not recorded"):
        restore_version(extra, cfg.store, device)
    trainer.close()


def test_a_delta_on_a_damaged_stored_version_is_refused_then_a_full_snapshot_is_served(loaded, cfg, caplog):
    srv, trainer, touched, client, events, want = loaded
    svc = srv.service
    name = biggest_sst(vdir_of(cfg, 1))
    flip_byte(vdir_of(cfg, 1) / name)
    changed = trainer.step()
    touched.add(changed)
    with caplog.at_level(logging.ERROR, logger="streamrec.serving"), \
            SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(trainer.snapshot("delta", changed))
    assert not r.ok and r.code == "DATA_LOSS" and r.needs_full and needs_full("DATA_LOSS"), r
    assert name in r.reason and "version 1" in r.reason, r.reason
    # never a silent answer from it: Predict refuses, health and Status say why
    err = unavailable(client, events)
    assert name in err.details(), err.details()
    assert client.health() == "NOT_SERVING"
    st = client.status()
    assert not st["serving"] and name in st["not_serving_reason"], st
    assert svc.stored_refused == 1
    lines = [rec.getMessage() for rec in caplog.records if name in rec.getMessage()]
    assert lines and "stored version 1" in lines[0], caplog.text
    # the trainer's next snapshot is full: accepted and served with the trainer's scores
    touched.add(trainer.step())
    with SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(trainer.snapshot("full", [], touched.rows()))
    assert r.ok and r.version == 3, r
    scores, version = client.predict(events)
    assert version == 3
    assert np.max(np.abs(scores - trainer.scores(events_to_batch(cfg, events)))) <= 1e-6
    assert client.health() == "SERVING" and client.status()["not_serving_reason"] == ""
    # and a delta on the new, intact version is verified and accepted
    changed = trainer.step()
    with SnapshotPusher(srv.target, token="push-tok") as p:
        r = p.push(trainer.snapshot("delta", changed))
    assert r.ok and r.version == 4, r
    assert svc.last_verify["when"] == "delta" and svc.last_verify["bytes"] > 0
    assert svc.stored_refused == 1


def test_a_restart_over_a_damaged_newest_version_serves_the_newest_that_verifies_or_nothing(cfg, tmp_path, caplog):
    trainer = FakeTrainer(cfg, tmp_path)
    events = make_events(cfg, 32, seed=7)
    batch = events_to_batch(cfg, events)
    touched = Touched()
    touched.add(trainer.step(n_rows=300))
    full = trainer.snapshot("full", [], touched.rows())
    want1 = trainer.scores(batch)
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target) as p:
        assert p.push(full).ok
    kept_v1 = tmp_path / "kept-v1"  # version 1 as stored, kept aside while version 2 replaces it
    shutil.copytree(vdir_of(cfg, 1), kept_v1)
    changed = trainer.step(n_rows=300)
    touched.add(changed)
    delta = trainer.snapshot("delta", changed)
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target) as p:
        assert srv.service.current.version == 1
        assert p.push(delta).ok
    assert vdir_of(cfg, 1).exists()  # kept for a rollback (serving.keep_versions)
    shutil.rmtree(vdir_of(cfg, 1))  # its own copy: versions share SST files by hard links, flipped below in v2
    shutil.copytree(kept_v1, vdir_of(cfg, 1))
    name = biggest_sst(vdir_of(cfg, 2))
    flip_byte(vdir_of(cfg, 2) / name)

    # the newest that verifies is version 1: served, with version 1's scores
    with caplog.at_level(logging.INFO, logger="streamrec.serving"), serve(server_settings(cfg), device="cpu") as srv, \
            ServingClient(srv.target) as c:
        scores, version = c.predict(events)
        assert version == 1 and np.max(np.abs(scores - want1)) <= 1e-6
        assert c.health() == "SERVING" and int(c.status()["version"]) == 1
        assert srv.service.stored_refused == 1 and srv.service.last_verify["when"] == "start"
        # the trainer's delta on version 2 cannot apply here: it needs a full snapshot
        changed = trainer.step(n_rows=300)
        touched.add(changed)
        with SnapshotPusher(srv.target) as p:
            r = p.push(trainer.snapshot("delta", changed))
        assert not r.ok and r.needs_full, r
    damaged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and name in r.getMessage()]
    assert len(damaged) == 1 and str(vdir_of(cfg, 2)) in damaged[0] and "version 2" in damaged[0], caplog.text
    assert vdir_of(cfg, 2).exists()  # left for the operator to look at

    # nothing verifies: NOT_SERVING, saying why, until a full snapshot arrives
    shutil.rmtree(vdir_of(cfg, 1))
    shutil.copytree(kept_v1, vdir_of(cfg, 1))
    name1 = "manifest.json"
    flip_byte(vdir_of(cfg, 1) / name1)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as c:
        assert c.health() == "NOT_SERVING"
        st = c.status()
        assert not st["serving"] and name in st["not_serving_reason"] and name1 in st["not_serving_reason"], st
        err = unavailable(c, events)
        assert name in err.details()
        assert srv.service.stored_refused == 2
        touched.add(trainer.step(n_rows=300))
        with SnapshotPusher(srv.target) as p:
            r = p.push(trainer.snapshot("full", [], touched.rows()))
        assert r.ok, r
        scores, version = c.predict(events)
        assert version == r.version and np.max(np.abs(scores - trainer.scores(batch))) <= 1e-6
        assert c.health() == "SERVING"
    trainer.close()


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.subprocess
def test_a_group_process_restarted_over_damaged_files_does_not_answer_from_them(cfg, tmp_path):
    cfg.serving.processes = 2
    cfg.serving.push_token = "push-tok"
    conf = save_config(cfg, tmp_path / "serve.toml")
    root = Path(cfg.serving.data_dir)
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--config", str(conf), "--port", "0",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=log, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        target = proc.stdout.readline().strip()
        assert target, log_path.read_text()[-2000:]
        trainer = FakeTrainer(cfg, tmp_path)
        touched = Touched()
        touched.add(trainer.step())
        events = make_events(cfg)
        with SnapshotPusher(target, token="push-tok", attempts=6, backoff_s=0.2) as p:
            r = p.push(trainer.snapshot("full", [], touched.rows()))
        assert r.ok and r.version == 1, r
        ports = read_group_file(root)
        # process 1's stored version 1 rots, and process 1 dies (kill -9); its supervisor restarts it
        name = biggest_sst(vdir_of(cfg, 1, proc=1))
        flip_byte(vdir_of(cfg, 1, proc=1) / name)
        victim = [c for c in psutil.Process(proc.pid).children(recursive=True)
                  if any(x.laddr.port == ports[1] and x.status == psutil.CONN_LISTEN
                         for x in c.net_connections("tcp"))]
        assert len(victim) == 1
        victim[0].send_signal(signal.SIGKILL)
        _wait(lambda: read_group_file(root).get(1, ports[1]) != ports[1], 60, "process 1's restart")
        with ServingClient(f"127.0.0.1:{read_group_file(root)[1]}", timeout=10) as c:
            st = c.status()
            assert not st["serving"] and name in st["not_serving_reason"], st
            assert c.health() == "NOT_SERVING"
            err = unavailable(c, events)
            assert name in err.details()
        with ServingClient(f"127.0.0.1:{read_group_file(root)[0]}", timeout=10) as c:
            assert c.predict(events)[1] == 1  # process 0's copy is intact
        text = log_path.read_text()
        assert "serve[1]" in text and name in text and "version 1" in text, text[-3000:]
        # a full snapshot brings process 1 back
        touched.add(trainer.step())
        with SnapshotPusher(target, token="push-tok", attempts=6, backoff_s=0.2) as p:
            r = p.push(trainer.snapshot("full", [], touched.rows()))
        assert r.ok and r.version == 2, r
        want = trainer.scores(events_to_batch(cfg, events))
        for port in read_group_file(root).values():
            with ServingClient(f"127.0.0.1:{port}", timeout=10) as c:
                scores, version = c.predict(events)
            assert version == 2 and np.max(np.abs(scores - want)) <= 1e-6
        trainer.close()
    finally:
        if proc.poll() is None:
            for p in psutil.Process(proc.pid).children(recursive=True):
                p.kill()
            proc.kill()
            proc.wait(10)
        log.close()
