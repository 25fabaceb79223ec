"""The trainer's snapshot publisher against real gRPC servers on loopback: several
replicas pushed to as a group, a replica that comes back empty gets a full snapshot,
a replica that is down gets the snapshot it missed when it returns."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from streamrec.ingest import free_port
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.trainer.snapshots import SnapshotPublisher
from tests.helpers.serving import FakeTrainer, events_to_batch, make_events
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.grpc


@pytest.fixture
def group(cfg, tmp_path):
    """Two replicas on fixed ports (so one can be restarted in place), a trainer and its publisher."""
    cfg.serving.push_token = "tok"
    ports = [free_port(), free_port()]
    cfg.serving.push_targets = ",".join(f"127.0.0.1:{p}" for p in ports)

    def start(i: int, data_dir: str):
        c = copy.deepcopy(cfg)
        c.serving.data_dir = data_dir
        return serve(server_settings(c), device="cpu", port=ports[i])

    servers = [start(i, str(tmp_path / f"serving-{i}")) for i in range(2)]
    trainer = FakeTrainer(cfg, tmp_path)
    pub = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snapshots",
                            model_hash=cfg.model_hash(), targets=cfg.push_targets(),
                            push=True, full_every=100, backoff_s=0.05, max_backoff_s=0.2,
                            pusher_factory=SnapshotPusher.factory(cfg.serving))
    state = {"version": 0, "events": make_events(cfg, 16)}

    def publish():
        """One training step, a store checkpoint, a snapshot; wait until every replica has it (or it was dropped)."""
        trainer.step()
        state["version"] += 1
        epoch = trainer.store.checkpoint(str(tmp_path / f"ckpt-{state['version']}"))
        assert pub.publish(state["version"], epoch, trainer.store, trainer.model, {}, {"auc": 0.5},
                           trainer.newest_event_ms) is not None
        return state["version"]

    def served(i: int):
        with ServingClient(servers[i].target, timeout=10) as c:
            c.wait_ready(10)  # a restarted replica: the channel may start in gRPC's reconnect backoff
            st = c.status()
            if not int(st.get("version", 0)):
                return 0, None
            scores, version = c.predict(state["events"])
            return version, scores

    def want():
        return trainer.scores(events_to_batch(cfg, state["events"]))

    yield servers, start, publish, served, want, pub
    pub.close()
    for s in servers:
        s.stop(0.5)
    trainer.close()


def test_every_replica_gets_each_snapshot_full_then_deltas(group):
    servers, _start, publish, served, want, pub = group
    for kind in ("full", "delta", "delta"):
        v = publish()
        assert pub.wait_idle(30), pub.st.last_error
        assert pub.version == v and pub.st.history[-1] == (v, kind)
        for i in range(2):
            version, scores = served(i)
            assert version == v
            assert np.max(np.abs(scores - want())) <= 1e-6


def test_a_replica_back_empty_gets_a_full_snapshot(group, tmp_path):
    servers, start, publish, served, want, pub = group
    publish()
    assert pub.wait_idle(30)
    servers[1].stop(0.5)
    servers[1] = start(1, str(tmp_path / "serving-1-new"))  # same port, lost its data
    v2 = publish()  # a delta: replica 0 takes it, the new replica 1 refuses it (no parent)
    assert pub.wait_idle(30)
    assert pub.st.need_full and "FAILED_PRECONDITION" in pub.st.last_error and pub.version == 1
    assert served(0)[0] == v2 and served(1)[0] == 0
    v3 = publish()
    assert pub.wait_idle(30), pub.st.last_error
    assert pub.st.history[-1] == (v3, "full") and pub.version == v3
    for i in range(2):
        version, scores = served(i)
        assert version == v3 and np.max(np.abs(scores - want())) <= 1e-6


def test_a_replica_that_was_down_gets_what_it_missed(group, tmp_path):
    servers, start, publish, served, want, pub = group
    publish()
    assert pub.wait_idle(30)
    servers[1].stop(0.5)  # down, data kept: it restores version 1 when it comes back
    v2 = publish()
    # replica 0 takes v2 and a push to replica 1 fails (however long a loaded machine takes to get there)
    wait_until(lambda: served(0)[0] == v2 and "UNAVAILABLE" in pub.st.last_error, 30,
               "v2 on replica 0 and a failed push to replica 1", interval=0.2)
    assert not pub.wait_idle(1.0) and pub.version == 1  # still pending for replica 1 (retried with backoff)
    servers[1] = start(1, str(tmp_path / "serving-1"))
    assert pub.wait_idle(30), pub.st.last_error
    assert pub.version == v2 and pub.st.history[-1] == (v2, "delta")  # the delta applied on the restored parent
    for i in range(2):
        version, scores = served(i)
        assert version == v2 and np.max(np.abs(scores - want())) <= 1e-6


def test_a_replica_down_too_long_is_left_behind_and_catches_up_with_a_full_snapshot(group, tmp_path):
    servers, start, publish, served, want, pub = group
    pub.give_up_s = 0.5
    publish()
    assert pub.wait_idle(30)
    servers[1].stop(0.5)
    for _ in range(2):  # replica 0 keeps getting fresh snapshots while replica 1 is down
        v = publish()
        assert pub.wait_idle(30)
        assert pub.version == v and served(0)[0] == v and pub.left_behind == [pub.targets[1]]
    servers[1] = start(1, str(tmp_path / "serving-1"))  # back with version 1: the next delta is not for it
    assert served(1)[0] == 1
    publish()
    assert pub.wait_idle(30) and pub.st.need_full and "FAILED_PRECONDITION" in pub.st.last_error
    v = publish()
    assert pub.wait_idle(30)
    assert pub.st.history[-1] == (v, "full") and pub.left_behind == []
    for i in range(2):
        version, scores = served(i)
        assert version == v and np.max(np.abs(scores - want())) <= 1e-6


def test_a_replica_left_behind_does_not_hold_back_every_later_snapshot(group):
    """Once a replica is left behind, later snapshots do not wait give_up_s for it again while it is
    still down: the healthy replicas get one per checkpoint, not one every give_up_s (2 min by default)."""
    servers, _start, publish, served, _want, pub = group
    pub.give_up_s = 2.0
    publish()
    assert pub.wait_idle(30)
    servers[1].stop(0.5)
    publish()
    assert pub.wait_idle(30) and pub.left_behind == [pub.targets[1]]
    # a publisher that waited give_up_s again for the replica left behind would not be idle within 30 s
    pub.give_up_s = 3600.0
    v = publish()
    assert pub.wait_idle(30), "the healthy replica waited give_up_s again for the one left behind"
    assert pub.version == v and served(0)[0] == v and pub.left_behind == [pub.targets[1]]
