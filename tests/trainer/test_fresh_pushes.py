"""Pushes between checkpoints: deltas of the rows the trainer's journal saw written, applied by a real
server on top of the version it serves; a delta on a base the server does not hold is refused and the
next push is full; versions keep rising across a restart (the version file, or the server's own answer)."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.trainer.changes import ChangeJournal
from streamrec.trainer.snapshots import SnapshotPublisher
from tests.helpers.serving import FakeTrainer, events_to_batch, make_events

pytestmark = pytest.mark.grpc


class Pushing:
    """A FakeTrainer whose store writes through a ChangeJournal, and the trainer's push step
    (``TrainerService.push``: plan, journal rows, reserved version, publish) against one server."""

    def __init__(self, cfg, tmp_path, server, version_file=None):
        self.cfg, self.tmp = cfg, tmp_path
        self.trainer = FakeTrainer(cfg, tmp_path)
        self.trainer.store = self.journal = ChangeJournal(self.trainer.store)
        self.server = server
        self.pub = self.publisher(version_file)
        self.events = make_events(cfg, 24)

    def publisher(self, version_file=None):
        return SnapshotPublisher(self.cfg.model, self.cfg.store, self.cfg.serving, self.tmp / "snapshots",
                                 model_hash=self.cfg.model_hash(), targets=self.cfg.push_targets(),
                                 push=True, full_every=1000, backoff_s=0.05,
                                 max_backoff_s=0.2, pusher_factory=SnapshotPusher.factory(self.cfg.serving),
                                 version_file=version_file)

    def push(self) -> int:
        plan = self.pub.plan_next()
        assert plan is not None
        rows, mark = self.journal.snapshot_rows(plan)
        version = self.pub.reserve_version()
        self.pub.publish(version, mark, None, self.trainer.model, {("events", 0): version}, {"auc": 0.5},
                         self.trainer.newest_event_ms, plan=plan, rows=rows)
        assert self.pub.wait_idle(30), self.pub.st.last_error
        return version

    def served(self):
        with ServingClient(self.server.target, timeout=10) as c:
            st = c.status()
            scores, version = c.predict(self.events)
        return st, scores, version

    def want(self):
        return self.trainer.scores(events_to_batch(self.cfg, self.events))

    def close(self):
        self.pub.close()
        self.trainer.close()


@pytest.fixture
def pushing(cfg, tmp_path):
    cfg.serving.push_token = "tok"
    server = serve(server_settings(cfg), device="cpu", port=0)
    cfg.serving.push_targets = server.target
    p = Pushing(cfg, tmp_path, server)
    yield p
    p.close()
    p.server.stop(0.5)


def test_a_delta_of_the_journaled_rows_is_applied_on_top_of_the_served_version(pushing):
    p = pushing
    p.trainer.step()
    v1 = p.push()
    assert p.pub.st.history[-1] == (v1, "full")
    for _ in range(3):
        changed = p.trainer.step(n_rows=50)
        v = p.push()
        st, scores, served = p.served()
        assert served == v and st["kind"] == "delta" and int(st["parent_version"]) == v - 1
        # the delta carried exactly the rows written since the last push
        manifest_rows = int(__import__("json").loads((p.tmp / "snapshots" / f"v{v:09d}" / "manifest.json")
                                                     .read_text())["rows"])
        assert manifest_rows == sum(len(ids) for _f, ids in changed)
        assert np.max(np.abs(scores - p.want())) <= 1e-6  # base rows + delta rows = the trainer's model


def test_a_delta_whose_base_the_server_lacks_is_refused_and_the_next_push_is_full(pushing, cfg, tmp_path):
    import copy

    p = pushing
    p.trainer.step()
    p.push()
    p.trainer.step()
    p.push()
    port = int(p.server.target.rsplit(":", 1)[1])
    p.server.stop(0.5)
    fresh = copy.deepcopy(cfg)
    fresh.serving.data_dir = str(tmp_path / "serving-new")  # back on the same port without its versions
    p.server = serve(server_settings(fresh), device="cpu", port=port)
    p.trainer.step()
    v = p.push()  # a delta on a base the new server never had
    assert p.pub.st.need_full and "FAILED_PRECONDITION" in p.pub.st.last_error and p.pub.version == v - 1
    assert p.pub.wants_full  # nothing new needs training for the full snapshot to go out
    v_full = p.push()
    st, scores, served = p.served()
    assert p.pub.st.history[-1] == (v_full, "full") and served == v_full and st["kind"] == "full"
    assert np.max(np.abs(scores - p.want())) <= 1e-6


def test_versions_rise_across_a_restart_from_the_version_file_or_the_servers_answer(pushing, tmp_path):
    p = pushing
    vfile = tmp_path / "ckpt" / "snapshot-version.json"
    p.pub.close()
    p.pub = p.publisher(vfile)
    p.trainer.step()
    p.push()
    p.trainer.step()
    v2 = p.push()
    # a new process (its checkpoint knew nothing of these pushes) numbers past them from the file
    p.pub.close()
    p.pub = p.publisher(vfile)
    p.journal.forget_through(p.journal.cut())
    p.trainer.step()
    v3 = p.push()
    assert v3 == v2 + 1 and p.served()[2] == v3
    # without the file: the first push is refused as not newer, the refusal says what is served, the next lands
    p.pub.close()
    p.pub = p.publisher(None)
    p.trainer.step()
    plan = p.pub.plan_next()
    rows, mark = p.journal.snapshot_rows(plan)
    p.pub.publish(1, mark, None, p.trainer.model, {}, {}, p.trainer.newest_event_ms, plan=plan, rows=rows)
    assert p.pub.wait_idle(30)
    assert "not newer" in p.pub.st.last_error and p.served()[2] == v3
    v4 = p.push()
    assert v4 == v3 + 1 and p.served()[2] == v4
    assert np.max(np.abs(p.served()[1] - p.want())) <= 1e-6


def test_the_journal_reads_rows_without_moving_the_stores_counters(cfg, tmp_path):
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                         torch.device("cpu"), path=str(tmp_path / "store"))
    j = ChangeJournal(store, max_ids=1000)
    try:
        f = cfg.model.field_names[0]
        ids = np.arange(10, dtype=np.int64)
        j.lookup(f, ids)
        j.apply_gradients(f, ids, torch.ones((10, cfg.model.embedding_dim)))
        m1 = j.cut()
        before = store.stats()
        rows = j.rows_since(0)
        assert [int(x) for b in rows for x in b.column("id").to_pylist()] == list(range(10))
        after = store.stats()
        assert (after["hot_hits"], after["cold_hits"]) == (before["hot_hits"], before["cold_hits"])
        got = np.stack([np.asarray(v, np.float32) for b in rows for v in b.column("vector").to_pylist()])
        assert np.array_equal(got, store.peek(f, ids).numpy())
        assert j.changed_ids(m1) == {}  # nothing written since
        # past max_ids the journal is dropped: a delta over the lost stretch carries every stored row
        j.apply_gradients(f, np.arange(100, 1200, dtype=np.int64), torch.ones((1100, cfg.model.embedding_dim)))
        assert j.changed_ids(m1) is None
        assert sum(len(b) for b in j.rows_since(m1)) == sum(len(b) for b in store.changed_rows(None))
    finally:
        store.close()
