"""Held versions, rollback, pin and accept over real gRPC on 127.0.0.1, with real snapshot files and stores:
a held version is installed (deltas build on it) but not served; a rollback swaps within a second and pins
across a restart; release serves the deltas that arrived meanwhile; accept promotes the held version; the
operator calls and a forged evidence block need the push token; a push without evidence is refused."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.snapshot import make_evidence, window
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events

pytestmark = pytest.mark.grpc


def _evidence(label_rate=0.2, mean_pred=0.2, logloss=0.45, events=2000):
    w = window(events, auc=0.75, logloss=logloss, label_rate=label_rate, mean_prediction=mean_pred)
    return make_evidence(w, w, records=events, field_novel_share={"user": 0.1})


def _set_evidence(snap, ev):
    """Replace the evidence block of a written snapshot (the manifest's own bytes carry no checksum)."""
    p = snap / "manifest.json"
    m = json.loads(p.read_text())
    if ev is None:
        m.pop("evidence", None)
    else:
        m["evidence"] = ev
    p.write_text(json.dumps(m))
    return snap


class Chain:
    """A fake trainer and the scores each version it wrote gives the test events."""

    def __init__(self, cfg, tmp_path):
        self.trainer = FakeTrainer(cfg, tmp_path)
        self.touched = Touched()
        self.events = make_events(cfg, 24, seed=5)
        self.batch = events_to_batch(cfg, self.events)
        self.want: dict[int, np.ndarray] = {}

    def next(self, ev=None):
        changed = self.trainer.step(n_rows=80)
        self.touched.add(changed)
        first = self.trainer.version == 0
        snap = (self.trainer.snapshot("full", [], self.touched.rows()) if first
                else self.trainer.snapshot("delta", changed))
        self.want[self.trainer.version] = self.trainer.scores(self.batch)
        return _set_evidence(snap, ev if ev is not None else _evidence())

    def check(self, client, version):
        scores, v = client.predict(self.events)
        assert v == version and np.max(np.abs(scores - self.want[version])) <= 1e-6


@pytest.fixture
def guarded(cfg, tmp_path):
    cfg.serving.push_token = "push-tok"
    cfg.serving.keep_versions = 4
    chain = Chain(cfg, tmp_path)
    yield cfg, chain
    chain.trainer.close()


def test_rollback_swaps_within_a_second_pins_across_a_restart_and_release_serves_the_deltas(guarded):
    cfg, chain = guarded
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target, token="push-tok") as p, ServingClient(srv.target, push_token="push-tok") as c:
            for _ in range(4):
                assert p.push(chain.next()).ok
            chain.check(c, 4)
            st = c.status()
            assert [int(x) for x in st["kept_versions"]] == [1, 2, 3, 4] and not st["pinned"]
            t0 = time.monotonic()
            r = c.rollback(to_version=1)
            chain.check(c, 1)  # the next request is answered by version 1
            assert time.monotonic() - t0 < 1.0 and r["pinned"] and int(r["version"]) == 1
            assert p.push(chain.next()).ok  # a delta on version 4 arrives while pinned: installed, not served
            chain.check(c, 1)
            st = c.status()
            assert int(st["version"]) == 1 and int(st["newest_version"]) == 5 and st["pinned"]
    finally:
        srv.stop(0.5)
    srv = serve(server_settings(cfg), device="cpu")  # the pin survives a restart
    try:
        with SnapshotPusher(srv.target, token="push-tok") as p, ServingClient(srv.target, push_token="push-tok") as c:
            chain.check(c, 1)
            assert c.status()["pinned"]
            assert p.push(chain.next()).ok  # the chain goes on from version 5
            chain.check(c, 1)
            r = c.rollback(release=True)
            assert not r["pinned"] and int(r["version"]) == 6
            chain.check(c, 6)
            r = c.rollback()  # no --to: the version promoted before the served one
            chain.check(c, 5)
            with pytest.raises(grpc.RpcError) as e:
                c.rollback(to_version=1)  # no longer kept (keep_versions 4: 3, 4, 5, 6)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND and "kept: [3, 4, 5, 6]" in e.value.details()
            c.rollback(release=True)
            chain.check(c, 6)
    finally:
        srv.stop(0.5)


def test_a_held_version_is_not_served_but_deltas_build_on_it_and_accept_promotes(guarded):
    cfg, chain = guarded
    from streamrec.ingest import free_port

    cfg.serving.metrics_port = free_port()
    cfg.serving.guard.recovery_versions = 2
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
            ServingClient(srv.target, push_token="push-tok") as c:
        assert p.push(chain.next()).ok and p.push(chain.next()).ok
        chain.check(c, 2)
        r = p.push(chain.next(_evidence(label_rate=1.0, mean_pred=0.3, logloss=1.3)))  # every label 1
        assert r.ok  # installed: the trainer's next delta builds on it
        chain.check(c, 2)
        st = c.status()
        assert int(st["newest_version"]) == 3 and st["held_reason"].startswith("label_rate:") and \
            int(st["versions_held"]) == 1
        assert srv.service.book.held_total == {"label_rate": 1}
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics.port}/metrics", timeout=5).read().decode()
        assert 'streamrec_serving_versions_held_total{reason="label_rate"} 1.0' in scrape
        assert "streamrec_serving_held 1.0" in scrape and "streamrec_serving_newest_version 3.0" in scrape
        assert p.push(chain.next()).ok  # the incident is over: a delta on the held version 3 passes ...
        chain.check(c, 2)
        assert c.status()["held_reason"].startswith("recovering:")  # ... but one passing version is not enough
        assert p.push(chain.next()).ok  # serving.guard.recovery_versions (2 here) in a row: promoted
        chain.check(c, 5)
        assert c.status()["held_reason"] == ""
        shifted = _evidence(label_rate=0.5, mean_pred=0.5, logloss=0.69)  # the stream really changed
        assert p.push(chain.next(shifted)).ok and p.push(chain.next(shifted)).ok
        chain.check(c, 5)
        with pytest.raises(grpc.RpcError) as e:
            c.accept(version=6)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "newest held version (7)" in e.value.details()
        assert int(c.accept()["version"]) == 7
        chain.check(c, 7)
        assert p.push(chain.next(shifted)).ok  # the history starts from the accepted version
        chain.check(c, 8)
        with pytest.raises(grpc.RpcError) as e:
            c.accept()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_no_evidence_is_refused_and_a_forged_block_or_an_operator_call_needs_the_token(guarded):
    cfg, chain = guarded
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as c:
        with SnapshotPusher(srv.target, token="push-tok") as p:
            r = p.push(_set_evidence(chain.next(), None))
        assert not r.ok and r.code == "INVALID_ARGUMENT" and "evidence" in r.reason
        assert not c.status()["serving"]
        forged = chain.next(_evidence())
        for token in ("", "nope"):
            with SnapshotPusher(srv.target, token=token) as p:
                r = p.push(forged)
            assert not r.ok and r.code == "UNAUTHENTICATED"
        for call in (lambda: c.rollback(release=True), lambda: c.accept()):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bad = chain.next(_evidence())
        m = json.loads((bad / "manifest.json").read_text())
        m["evidence"]["since_previous"]["label_rate"] = 7.0  # out of range: refused before a byte is stored
        (bad / "manifest.json").write_text(json.dumps(m))
        with SnapshotPusher(srv.target, token="push-tok") as p:
            r = p.push(bad)
        assert not r.ok and r.code == "INVALID_ARGUMENT" and "evidence.since_previous.label_rate" in r.reason


@pytest.mark.subprocess
def test_the_rollback_and_accept_commands(guarded):
    import subprocess
    import sys

    cfg, chain = guarded

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "streamrec.app.cli", *args, "--target", srv.target],
                              capture_output=True, text=True, timeout=60)

    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
            ServingClient(srv.target) as c:
        for _ in range(3):
            assert p.push(chain.next()).ok
        r = cli("rollback", "--to", "1", "--token", "push-tok")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["version"] == 1 and out["pinned"] and "pinned" in out["message"]  # a number, not "1"
        chain.check(c, 1)
        r = cli("rollback", "--release", "--set", "serving.push_token=push-tok")
        assert r.returncode == 0 and int(json.loads(r.stdout)["version"]) == 3, r.stderr
        r = cli("accept", "--token", "push-tok")
        assert r.returncode == 1 and "FAILED_PRECONDITION: no version is held back" in r.stderr
        r = cli("rollback", "--to", "2", "--token", "wrong")
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
        chain.check(c, 3)


@pytest.mark.subprocess
def test_the_operator_commands_reach_the_server_without_loading_torch():
    """``rollback`` and ``accept`` are what an operator types during an incident: their path (the CLI's config and
    the serving client) imports no torch, which alone takes seconds on a loaded machine."""
    import subprocess
    import sys

    code = ("import sys\nfrom streamrec.app.cli import config_from_args\nfrom streamrec.serving import ServingClient\n"
            "from streamrec.app.commands import serve\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)
