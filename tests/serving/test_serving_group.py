"""A serving group (``serving.processes``): several server processes on one port, each push reaching all of
them, a killed process restarted and brought back by the next full snapshot, the processes gone with their
supervisor. Real ``streamrec serve`` processes, real gRPC on loopback, real RocksDB version stores."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from streamrec.app.config import save_config
from streamrec.serving import ServingClient, SnapshotPusher, events_to_request
from streamrec.app.wiring import server_settings
from streamrec.serving.pb import pb_grpc
from streamrec.serving.siblings import read_group_file
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]


def _status(root: Path, key: str = "version") -> dict[int, int]:
    """Process index -> ``key`` of its Status (the version it serves by default), asked on each process's own
    loopback port."""
    out = {}
    for i, port in read_group_file(root).items():
        with ServingClient(f"127.0.0.1:{port}", timeout=10) as c:
            out[i] = int(c.status()[key])
    return out


def _push(target: str, snapshot_dir):
    """Push on a new connection (a kept one could lead to the process the test has just killed, and gRPC's
    reconnect backoff would then delay the push past that process's restart)."""
    with SnapshotPusher(target, token="push-tok", attempts=6, backoff_s=0.2) as pusher:
        return pusher.push(snapshot_dir)


def _pid_listening_on(parent: psutil.Process, port: int) -> int:
    for child in parent.children(recursive=True):
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in child.net_connections("tcp")):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no process of the group listens on {port}")


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_group_serves_every_push_on_one_port_and_recovers_a_killed_process(cfg, tmp_path):
    cfg.serving.processes = 2
    cfg.serving.push_token = "push-tok"
    conf = save_config(cfg, tmp_path / "serve.toml")
    root = Path(cfg.serving.data_dir)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--config", str(conf), "--port", "0",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        target = proc.stdout.readline().strip()
        assert target, (tmp_path / "serve.log").read_text()[-2000:]
        supervisor = psutil.Process(proc.pid)
        ports = read_group_file(root)
        assert sorted(ports) == [0, 1] and len(set(ports.values())) == 2
        trainer = FakeTrainer(cfg, tmp_path)
        touched = Touched()
        touched.add(trainer.step())
        events = make_events(cfg)
        # a push to the shared port reaches both processes
        r = _push(target, trainer.snapshot("full", [], touched.rows()))
        assert r.ok and r.version == 1, r
        assert _status(root) == {0: 1, 1: 1}

        # many connections: the kernel spreads them over both processes, every answer is the model's
        want = trainer.scores(events_to_batch(cfg, events))
        request = events_to_request(events)
        for _ in range(16):
            with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                resp = pb_grpc.StreamRecStub(ch).Predict(request, timeout=10)
            assert resp.model_version == 1
            assert np.max(np.abs(np.asarray(resp.scores, np.float32) - want)) <= 1e-6
        counts = _status(root, "requests_served")
        assert sum(counts.values()) == 16 and min(counts.values()) > 0, counts  # 2 * 2^-16 to fail by chance
        answered = set()  # Status names the process that answered it
        for _ in range(16):
            with ServingClient(target, own_connection=True) as c:
                st = c.status()
            assert st["processes"] == 2
            answered.add(st["process"])
        assert answered == {0, 1}

        # kill -9 process 1: a push meanwhile is accepted by the rest (process 1 gets no connections). The delta
        # is written first and pushed once the process is gone, inside the supervisor's restart backoff (1 s):
        # a push that reached the restarted process would find it able to take the delta
        changed = trainer.step()
        touched.add(changed)
        delta = trainer.snapshot("delta", changed)
        old_port = ports[1]
        victim = psutil.Process(_pid_listening_on(supervisor, old_port))
        victim.kill()
        victim.wait(10)
        r = _push(target, delta)
        assert r.ok and r.version == 2, r
        # the supervisor restarts it; it serves what it held (version 1) on a new loopback port
        _wait(lambda: read_group_file(root).get(1, old_port) != old_port, 60, "process 1's restart")
        assert _status(root) == {0: 2, 1: 1}

        # the next delta cannot apply on process 1: the push is refused as needing a full snapshot ...
        changed = trainer.step()
        touched.add(changed)
        r = _push(target, trainer.snapshot("delta", changed))
        assert not r.ok and r.code == "FAILED_PRECONDITION" and r.needs_full, r
        # ... and the full one brings the whole group to the same version
        touched.add(trainer.step())
        r = _push(target, trainer.snapshot("full", [], touched.rows()))
        assert r.ok and r.version == 4, r
        assert _status(root) == {0: 4, 1: 4}
        want = trainer.scores(events_to_batch(cfg, events))
        for port in read_group_file(root).values():
            with ServingClient(f"127.0.0.1:{port}") as c:
                scores, version = c.predict(events)
            assert version == 4 and np.max(np.abs(scores - want)) <= 1e-6
        trainer.close()

        # kill -9 the supervisor: its processes notice and stop by themselves
        workers = supervisor.children(recursive=True)
        assert len(workers) >= 2
        proc.kill()
        proc.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, [p.pid for p in alive]
    finally:
        if proc.poll() is None:
            for p in psutil.Process(proc.pid).children(recursive=True):
                p.kill()
            proc.kill()
        log.close()


@pytest.mark.parametrize("broken", ["tls", "snapshot"])
def test_a_process_that_cannot_start_fails_the_group_start_with_its_reason(cfg, tmp_path, broken):
    """A missing TLS key, or a missing ``--snapshot`` directory (refused as a lone server refuses it)."""
    from streamrec.serving import ServingGroup
    from streamrec.serving.group import GroupStartError

    cfg.serving.processes = 2
    snapshot = None
    if broken == "tls":
        cfg.serving.tls_cert, cfg.serving.tls_key = str(tmp_path / "missing.pem"), str(tmp_path / "missing.key")
        why = r"FileNotFoundError.*missing"
    else:
        snapshot, why = str(tmp_path / "missing-snapshot"), r"SnapshotError: .*missing-snapshot.*does not exist"
    group = ServingGroup(server_settings(cfg), device="cpu", port=0, snapshot=snapshot)
    with pytest.raises(GroupStartError, match=rf"serving process \d failed to start: {why}"):
        group.start()
    assert group.processes == {}  # none left running
