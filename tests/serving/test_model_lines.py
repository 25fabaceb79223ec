"""Model lines on one endpoint, over real gRPC on 127.0.0.1 with real snapshot files and stores: the A/B
split's shares and stickiness, each line's answers equal to its own model's scores, a named line, an unknown
line refused, a line without a model falling back to main, a shadow line scored and compared but never
returned, each line's own guard, rollback and pin, and all of it across a restart."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import numpy as np
import pytest

from streamrec.foundation import ConfigError
from streamrec.app.config import load_config
from streamrec.serving.serving_config import ExperimentSpec
from streamrec.serving import ServingClient, SnapshotPusher, events_to_request, serve
from streamrec.app.wiring import server_settings
from streamrec.serving.lines import MAIN, Split, shadow_auc, split_key
from streamrec.snapshot import rows_batch, write_snapshot
from streamrec.snapshot import empty_evidence
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events


class LineTrainer(FakeTrainer):
    """A fake trainer whose snapshots name a model line (as ``serving.model_line`` makes the real one do)."""

    def __init__(self, cfg, tmp_path, line: str, seed: int):
        (tmp_path / line).mkdir(exist_ok=True)
        super().__init__(cfg, tmp_path / line, seed=seed)
        self.line = line
        self.touched = Touched()

    def next(self):
        changed = self.step(n_rows=80)
        self.touched.add(changed)
        parent = self.version or None
        self.version += 1
        full = parent is None
        rows = [rows_batch(f, ids, self.store.peek(f, ids)) for f, ids in (self.touched.rows() if full else changed)]
        return write_snapshot(
            self.tmp / f"snap-{self.version}", version=self.version, parent_version=None if full else parent,
            kind="full" if full else "delta", dense_state=self.model.state_dict(), rows=rows,
            kafka_offsets={"events:0": self.version}, metrics={}, config_hash=self.cfg.model_hash(),
            newest_event_ms=self.newest_event_ms, model_config=self.cfg.to_dict()["model"],
            store_config={"init_scale": self.cfg.store.init_scale}, evidence=empty_evidence(), model_line=self.line)


def user_events(cfg, users, seed=11):
    """One event per user id (field ``user`` carries it first), other fields random."""
    events = make_events(cfg, len(users), seed=seed)
    for e, u in zip(events, users):
        e["sparse"]["user"] = [int(u)]
    return events


# -- the split, in process ------------------------------------------------------------------------
def test_split_shares_are_within_one_percent_over_100k_users_and_a_user_keeps_its_line(cfg):
    split = Split([ExperimentSpec("main", 0.5), ExperimentSpec("b", 0.3), ExperimentSpec("c", 0.2)], "user")
    users = np.random.default_rng(0).integers(0, 2**62, 100_000)
    lines = [split.line_for_key(int(u)) for u in users]
    counts = {n: lines.count(n) / len(lines) for n in ("main", "b", "c")}
    assert abs(counts["main"] - 0.5) < 0.01 and abs(counts["b"] - 0.3) < 0.01 and abs(counts["c"] - 0.2) < 0.01
    assert [split.line_for_key(int(u)) for u in users[:1000]] == lines[:1000]  # deterministic
    # the key is what the request carries, in both wire forms (and string ids as the trainer hashes them)
    ev = user_events(cfg, [123456789])
    assert split_key(events_to_request(ev, columns=True), "user") == 123456789
    assert split_key(events_to_request(ev, columns=False), "user") == 123456789
    ev[0]["sparse"]["user"] = ["alice"]
    from streamrec.foundation import hash_id

    assert split_key(events_to_request(ev, columns=True), "user") == hash_id("alice") == \
        split_key(events_to_request(ev, columns=False), "user")
    assert split_key(events_to_request(ev, columns=True), "request_id") == hash_id("r0")
    assert Split([], "user").line_for_key(5) == MAIN


def test_the_split_config_is_validated():
    with pytest.raises(ConfigError, match="shares sum to 0.9"):
        load_config(overrides={"serving.experiments": [{"line": "main", "share": 0.5}, {"line": "b", "share": 0.4}]})
    with pytest.raises(ConfigError, match="not a model line name"):
        load_config(overrides={"serving.experiments": [{"line": "Main!", "share": 1.0}]})
    with pytest.raises(ConfigError, match="answered or shadowed"):
        load_config(overrides={"serving.experiments": [{"line": "main", "share": 0.5}, {"line": "b", "share": 0.5}],
                               "serving.shadow_line": "b"})


def test_shadow_auc_joins_labels_by_request_id():
    log = [("r1", "main", "s", 0.9, 0.2), ("r2", "main", "s", 0.1, 0.8), ("r3", "main", "s", 0.7, 0.6),
           ("r4", "main", "s", 0.5, 0.5)]
    out = shadow_auc(log, {"r1": 1, "r2": 0, "r3": 1})  # r4 has no label yet
    f = out[("main", "s")]
    assert f["events"] == 3 and f["auc_line"] == 1.0 and f["auc_shadow"] == 0.0


# -- over gRPC ------------------------------------------------------------------------------------
@pytest.fixture
def two_lines(cfg, tmp_path):
    from streamrec.ingest import free_port

    cfg.serving.push_token = "push-tok"
    cfg.serving.keep_versions = 4
    cfg.serving.metrics_port = free_port()
    cfg.serving.experiments = [ExperimentSpec("main", 0.5), ExperimentSpec("b", 0.5)]
    main, b = LineTrainer(cfg, tmp_path, "main", seed=0), LineTrainer(cfg, tmp_path, "b", seed=1)
    yield cfg, main, b
    main.close()
    b.close()


@pytest.mark.grpc
def test_each_line_answers_with_its_own_model_and_a_user_stays_on_its_line(two_lines):
    cfg, main, b = two_lines
    users = list(range(1000, 1060))
    events = user_events(cfg, users)
    batch = events_to_batch(cfg, events)
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
            ServingClient(srv.target, push_token="push-tok") as c:
        assert p.push(main.next()).ok
        # line b has no model yet: its share is answered by main, and counted
        _, _, line = c.predict_line(events[:1])
        assert line == MAIN
        for i in range(len(events)):
            c.predict_line(events[i:i + 1])
        fallbacks = srv.service.lines.stats["b"].fallbacks
        assert fallbacks > 0
        assert p.push(b.next()).ok
        want = {MAIN: main.scores(batch), "b": b.scores(batch)}
        assert np.max(np.abs(want[MAIN] - want["b"])) > 1e-3  # the two models differ: the check below can fail
        seen = {}
        for rnd in range(2):
            for i, u in enumerate(users):
                scores, version, line = c.predict_line(events[i:i + 1])
                assert version == 1 and abs(float(scores[0]) - float(want[line][i])) <= 1e-6, (u, line)
                assert seen.setdefault(u, line) == line  # the same user, the same line
        assert set(seen.values()) == {MAIN, "b"}
        # a named line answers whatever the split says; an unknown one is refused
        for name in (MAIN, "b"):
            scores, _, line = c.predict_line(events, model_line=name)
            assert line == name and np.max(np.abs(scores - want[name])) <= 1e-6
        with pytest.raises(grpc.RpcError) as e:
            c.predict_line(events, model_line="nope")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in e.value.details()
        st = c.status()
        lines = {x["model_line"]: x for x in st["lines"]}
        assert set(lines) == {MAIN, "b"} and lines["b"]["share"] == 0.5 and int(lines["b"]["version"]) == 1
        assert int(lines["b"]["fallbacks"]) == fallbacks and int(lines["b"]["requests"]) > 0
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics.port}/metrics", timeout=5).read().decode()
        assert f'streamrec_serving_line_fallbacks_total{{line="b"}} {float(fallbacks)}' in scrape
        assert 'streamrec_serving_line_requests_total{line="b"}' in scrape
        assert 'streamrec_serving_line_mean_score{line="main"}' in scrape


@pytest.mark.grpc
def test_each_line_has_its_own_rollback_and_pin_and_they_survive_a_restart(two_lines):
    cfg, main, b = two_lines
    events = user_events(cfg, range(20))
    batch = events_to_batch(cfg, events)
    want = {}
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
            ServingClient(srv.target, push_token="push-tok") as c:
        for t in (main, b, main, b, b):
            assert p.push(t.next()).ok
            want[t.line, t.version] = t.scores(batch)
        r = c.rollback(to_version=1, model_line="b")
        assert r["pinned"] and int(r["version"]) == 1 and r["model_line"] == "b"
        scores, v, _ = c.predict_line(events, model_line="b")
        assert v == 1 and np.max(np.abs(scores - want["b", 1])) <= 1e-6
        scores, v, _ = c.predict_line(events, model_line=MAIN)  # main is neither rolled back nor pinned
        assert v == 2 and np.max(np.abs(scores - want[MAIN, 2])) <= 1e-6
        assert p.push(b.next()).ok  # b's chain goes on from its head (3) while pinned
        lines = {x["model_line"]: x for x in c.status()["lines"]}
        assert lines["b"]["pinned"] and int(lines["b"]["newest_version"]) == 4 and not lines[MAIN]["pinned"]
        with pytest.raises(grpc.RpcError) as e:
            c.rollback(model_line="nope")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    want["b", 4] = b.scores(batch)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target, push_token="push-tok") as c:
        lines = {x["model_line"]: x for x in c.status()["lines"]}
        assert set(lines) == {MAIN, "b"} and lines["b"]["pinned"] and int(lines["b"]["version"]) == 1
        scores, v, _ = c.predict_line(events, model_line="b")
        assert v == 1 and np.max(np.abs(scores - want["b", 1])) <= 1e-6
        assert int(c.predict_line(events, model_line=MAIN)[1]) == 2
        r = c.rollback(release=True, model_line="b")
        assert not r["pinned"] and int(r["version"]) == 4
        scores, v, _ = c.predict_line(events, model_line="b")
        assert v == 4 and np.max(np.abs(scores - want["b", 4])) <= 1e-6


@pytest.mark.grpc
def test_a_shadow_line_is_scored_and_compared_but_never_returned(cfg, tmp_path, capsys):
    from streamrec.ingest import free_port

    cfg.serving.push_token = "push-tok"
    cfg.serving.metrics_port = free_port()
    cfg.serving.shadow_line = "shadow"
    main, sh = LineTrainer(cfg, tmp_path, "main", seed=0), LineTrainer(cfg, tmp_path, "shadow", seed=1)
    events = user_events(cfg, range(40))
    batch = events_to_batch(cfg, events)
    try:
        with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
                ServingClient(srv.target, push_token="push-tok") as c:
            assert p.push(main.next()).ok and p.push(sh.next()).ok
            a, b = main.scores(batch), sh.scores(batch)
            assert np.max(np.abs(a - b)) > 1e-3
            for _ in range(3):
                scores, v, line = c.predict_line(events)
                assert line == MAIN and np.max(np.abs(scores - a)) <= 1e-6  # the shadow's never reach the caller
            assert srv.service.lines.drain(10)
            st = c.status()
            (pair,) = st["shadow"]
            diff = np.abs(a.astype(np.float64) - b)
            assert pair["model_line"] == MAIN and pair["shadow_line"] == "shadow" and int(pair["events"]) == 120
            assert abs(pair["mean_abs_diff"] - diff.mean()) < 1e-5
            assert abs(pair["disagree_share"] - (diff > 0.1).mean()) < 1e-9
            assert abs(pair["calibration"] - b.sum() / a.sum()) < 1e-5
            assert {x["model_line"]: x["shadow"] for x in st["lines"]} == {MAIN: False, "shadow": True}
            log = list(srv.service.lines.shadow_log)
            assert len(log) == 120 and log[0][0] == "r0" and abs(log[0][4] - b[0]) < 1e-6
            scrape = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics.port}/metrics",
                                            timeout=5).read().decode()
            assert 'streamrec_serving_shadow_events_total{line="main",shadow="shadow"} 120.0' in scrape
            # the per-event scores, for the AUC once labels arrive: by request id, over gRPC with the push token
            got = c.shadow_scores(limit=40)
            assert len(got) == 40 and all(line == MAIN and s == "shadow" for _, line, s, _, _ in got)
            assert [rid for rid, *_ in got] == [f"r{i}" for i in range(40)]
            assert max(abs(x[3] - a[i]) for i, x in enumerate(got)) < 1e-6
            labels = {f"r{i}": float(a[i] > np.median(a)) for i in range(40)}  # labels the answer ranks perfectly
            f = shadow_auc(got, labels)[(MAIN, "shadow")]
            assert f["events"] == 40 and f["auc_line"] == 1.0 and f["auc_shadow"] < 1.0
            with ServingClient(srv.target) as anon, pytest.raises(grpc.RpcError) as e:
                anon.shadow_scores()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            from streamrec.app.report import lines_table

            table = "\n".join(lines_table(c.status()))
            assert "| main | 100% | 1 |" in table and "| shadow | shadow | 1 |" in table
            assert f"| main / shadow | 120 | {diff.mean():.4f} |" in table
            from streamrec.app.cli import main as cli

            capsys.readouterr()
            assert cli(["lines", "--target", srv.target, "--json"]) == 0
            out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert [x["model_line"] for x in out["lines"]] == [MAIN, "shadow"] and int(out["shadow"][0]["events"]) == 120
    finally:
        main.close()
        sh.close()


def _evidence(label_rate=0.2):
    from streamrec.snapshot import make_evidence, window

    w = window(2000, auc=0.75, logloss=0.45, label_rate=label_rate, mean_prediction=label_rate)
    return make_evidence(w, w, records=2000, field_novel_share={"user": 0.1})


def _with_evidence(snap, ev):
    p = snap / "manifest.json"
    m = json.loads(p.read_text())
    m["evidence"] = ev
    p.write_text(json.dumps(m))
    return snap


@pytest.mark.grpc
def test_each_line_has_its_own_guard_and_accept(two_lines):
    cfg, main, b = two_lines
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
            ServingClient(srv.target, push_token="push-tok") as c:
        for t in (main, b, main, b):
            assert p.push(_with_evidence(t.next(), _evidence())).ok
        assert p.push(_with_evidence(b.next(), _evidence(label_rate=1.0))).ok  # line b's stream goes wrong
        lines = {x["model_line"]: x for x in c.status()["lines"]}
        assert lines["b"]["held_reason"].startswith("label_rate:") and int(lines["b"]["version"]) == 2
        assert lines[MAIN]["held_reason"] == "" and int(lines[MAIN]["version"]) == 2
        assert p.push(_with_evidence(main.next(), _evidence())).ok  # main's guard never saw b's evidence
        assert int(c.predict_line(user_events(cfg, [1]), model_line=MAIN)[1]) == 3
        assert int(c.predict_line(user_events(cfg, [1]), model_line="b")[1]) == 2
        with pytest.raises(grpc.RpcError) as e:
            c.accept()  # main holds nothing back
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        r = c.accept(model_line="b")
        assert int(r["version"]) == 3 and r["model_line"] == "b"
        assert int(c.predict_line(user_events(cfg, [1]), model_line="b")[1]) == 3
        assert srv.service.lines.service("b").book.held_total == {"label_rate": 1}
        assert not srv.service.book.held_total


@pytest.mark.broker
def test_the_auc_join_reads_labels_by_request_id_from_the_events_topic(cfg, bootstrap):
    import uuid

    from streamrec.app.report import topic_labels
    from streamrec.ingest import encode_json, make_producer

    cfg.kafka.bootstrap = bootstrap
    cfg.kafka.events_topic = f"events-{uuid.uuid4().hex[:8]}"
    events = make_events(cfg, 30, seed=2)
    prod = make_producer(bootstrap)
    for i, e in enumerate(events):
        prod.send(cfg.kafka.events_topic, encode_json({**e, "ts": 1_700_000_000_000 + i, "label": float(i % 3 == 0)}))
    prod.send(cfg.kafka.events_topic, b"not json")  # a record the trainer dead-letters: skipped here
    prod.flush()
    prod.close()
    got = topic_labels(cfg, {"r0", "r1", "r3", "r-none"}, timeout=20)
    assert got == {"r0": 1.0, "r1": 0.0, "r3": 1.0}


@pytest.mark.grpc
def test_the_trainers_publisher_pushes_to_its_serving_model_line(cfg, tmp_path):
    """A trainer with ``serving.model_line = "b"`` writes it into every manifest, and serving files its
    versions under line b: main stays empty, and b answers with the trainer's scores."""
    import copy

    from streamrec.ingest import free_port
    from streamrec.snapshot import read_manifest
    from streamrec.trainer.snapshots import SnapshotPublisher

    cfg.serving.push_token = "tok"
    cfg.serving.target = f"127.0.0.1:{free_port()}"
    tcfg = copy.deepcopy(cfg)
    tcfg.serving.model_line = "b"
    trainer = FakeTrainer(cfg, tmp_path)
    pub = SnapshotPublisher(tcfg.model, tcfg.store, tcfg.serving, tmp_path / "snapshots",
                            model_hash=tcfg.model_hash(), targets=tcfg.push_targets(),
                            push=True, full_every=100, backoff_s=0.05,
                            max_backoff_s=0.2, pusher_factory=SnapshotPusher.factory(tcfg.serving))
    events = make_events(cfg, 16)
    try:
        with serve(server_settings(cfg), device="cpu", port=int(cfg.serving.target.rsplit(":", 1)[1])) as srv, \
                ServingClient(srv.target) as c:
            trainer.step()
            epoch = trainer.store.checkpoint(str(tmp_path / "ckpt-1"))
            out = pub.publish(1, epoch, trainer.store, trainer.model, {}, {"auc": 0.5}, trainer.newest_event_ms)
            assert read_manifest(out).model_line == "b"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not ("b" in srv.service.lines.names
                                                       and srv.service.lines.service("b").current is not None):
                time.sleep(0.05)
            scores, v, line = c.predict_line(events, model_line="b")
            assert v == 1 and line == "b"
            assert np.max(np.abs(scores - trainer.scores(events_to_batch(cfg, events)))) <= 1e-6
            assert srv.service.current is None  # nothing was pushed to main
    finally:
        pub.close()
        trainer.close()
