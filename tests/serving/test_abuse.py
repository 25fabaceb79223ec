"""The serving endpoint under hostile and careless clients (issue #15), each case against a real
server on loopback (real gRPC, real snapshot files, no mocks of gRPC):

- bounded requests: bytes, events, ids per event and per request, calls at once, heavy requests;
  each refusal names its limit, is decided before the work it bounds, and the server goes on
  answering everyone else;
- valid inputs only: malformed bytes, out-of-range dense values, and never a NaN score;
- validated pushes: names, manifest shape and depth, model dimensions, non-finite tensors,
  versions out of the window; refused for good (the pushers do not retry them) while the old
  version keeps serving;
- safe defaults: an open push endpoint on the network needs ``--insecure-push``, metrics bind
  loopback, Status can require the predict token;
- both reflection versions, health NOT_SERVING until a model is installed, and the lanes that
  keep long-lived streams from taking Predict's or the pushes' threads.

The isolation figure (a well-behaved client's p99 with an abusive one running) is measured by
``streamrec bench serve`` (``p99_ratio_under_abuse``), not here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as refl

from streamrec.foundation import ConfigError
from streamrec.serving import ServingClient, ServingServer, SnapshotPusher, serve, snapshot_chunks
from streamrec.app.wiring import server_settings
from streamrec.serving.pb import pb
from streamrec.serving.server import is_loopback
from tests.helpers.serving import (FakeTrainer, Touched, events_to_batch, make_events, push_stream, serving_version_1,
                                   still_serving_v1, trained_once)

pytestmark = pytest.mark.grpc

PREDICT = "/streamrec.v1.StreamRec/Predict"


@pytest.fixture
def guarded(cfg, tmp_path):
    """A server with small limits and both tokens, serving version 1; plus the trainer and events."""
    s = cfg.serving
    s.max_batch, s.max_ids_per_event, s.max_ids_per_request = 50, 64, 400
    s.max_request_kb, s.max_message_mb = 64, 1
    yield from serving_version_1(cfg, tmp_path)


def _raw(channel, method: str, blob: bytes, token: str = "pred-tok", timeout: float = 10):
    """One unary call with raw request bytes; returns the RpcError it must end in."""
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(method)(blob, timeout=timeout, metadata=(("authorization", f"Bearer {token}"),))
    return e.value


def _refused(err, code: grpc.StatusCode, *words: str):
    assert err.code() == code and all(w in err.details() for w in words), (err.code(), err.details())


def _columns(n_events: int, ids_per_event: int, field: str = "tags", dense_dim: int = 3) -> "pb.PredictRequest":
    """A column-wise request built straight from numpy (fast even for millions of ids)."""
    req = pb.PredictRequest()
    c = req.columns
    c.size = n_events
    c.dense_f32 = np.zeros(n_events * dense_dim, "<f4").tobytes()
    col = c.sparse[field]
    col.values_i64 = np.arange(n_events * ids_per_event, dtype="<i8").tobytes()
    col.lengths_u32 = np.full(n_events, ids_per_event, "<u4").tobytes()
    return req


# -- bounded requests, valid inputs -------------------------------------------------------------

def test_malformed_bytes_are_invalid_argument_on_every_rpc(guarded):
    srv, trainer, touched, client, events, want = guarded
    garbage = b"\x0a\xff\xff\xff\xff\x0f" + bytes(range(256))
    _refused(_raw(client.channel, PREDICT, garbage), grpc.StatusCode.INVALID_ARGUMENT, "malformed protobuf")
    _refused(_raw(client.channel, "/streamrec.v1.StreamRec/Status", garbage), grpc.StatusCode.INVALID_ARGUMENT,
             "StatusRequest")
    # a push stream whose second message is garbage (the first, a real manifest, is fine)
    snap = trainer.snapshot("delta", trainer.step())
    chunks = list(snapshot_chunks(snap))
    with pytest.raises(grpc.RpcError) as e:
        client.channel.stream_unary("/streamrec.v1.StreamRec/PushSnapshot")(
            iter([chunks[0].SerializeToString(), garbage]), timeout=20,
            metadata=(("authorization", "Bearer push-tok"),))
    _refused(e.value, grpc.StatusCode.INVALID_ARGUMENT, "message 1", "malformed protobuf")
    still_serving_v1(client, events, want)


def test_dense_values_must_be_finite_and_within_the_ingest_bound(guarded):
    srv, trainer, touched, client, events, want = guarded
    srv.service.limits = dataclasses.replace(srv.service.limits, dense_abs_max=100.0)  # ingest.dense_abs_max
    for value, why in ((3e38, "beyond +-ingest.dense_abs_max (100)"), (100.5, "beyond"), (float("inf"), "not finite"),
                       (float("-inf"), "not finite"), (float("nan"), "not finite")):
        evs = [events[0], dict(events[1], dense=[0.0, value, 0.0])]
        for columns, where in ((False, "events[1].dense[1]"), (True, "columns.dense: event 1, value 1")):
            with pytest.raises(grpc.RpcError) as e:
                client.predict(evs, columns=columns)
            _refused(e.value, grpc.StatusCode.INVALID_ARGUMENT, where, why)
    scores, version = client.predict([dict(events[0], dense=[100.0, -100.0, 0.0])])  # the bound itself is fine
    assert version == 1 and np.isfinite(scores).all()
    still_serving_v1(client, events, want)


def test_request_limits_are_named_and_decided_before_any_scoring(guarded):
    srv, trainer, touched, client, events, want = guarded
    rounds = srv.service.merger.rounds
    # the client: one event with 2,000,000 ids (16 MB) -> over serving.max_message_mb: gRPC refuses it
    with pytest.raises(grpc.RpcError) as e:
        client.predict_request(_columns(1, 2_000_000))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # under the message limit, over serving.max_request_kb (64 KiB): refused before it is parsed
    big = dict(events[0], request_id="x" * (100 << 10))
    with pytest.raises(grpc.RpcError) as e:
        client.predict([big])
    _refused(e.value, grpc.StatusCode.RESOURCE_EXHAUSTED, "serving.max_request_kb")
    cases = [  # (request, the words its refusal must hold)
        (_columns(1, 65), ("event 0 has 65 ids", "serving.max_ids_per_event")),
        (_columns(10, 41), ("410 ids", "serving.max_ids_per_request")),
        (_columns(51, 1), ("51 events", "serving.max_batch")),
    ]
    per_event = pb.PredictRequest()
    per_event.events.add(dense=[0.0] * 3).sparse["tags"].ids.extend(range(40))
    per_event.events[0].sparse["user"].keys.extend(f"u{i}" for i in range(25))  # string ids count too
    cases.append((per_event, ("events[0].sparse", "serving.max_ids_per_event")))
    many = pb.PredictRequest()
    for _ in range(8):
        many.events.add(dense=[0.0] * 3).sparse["tags"].ids.extend(range(60))
    cases.append((many, ("events[6]", "serving.max_ids_per_request")))
    for req, words in cases:
        with pytest.raises(grpc.RpcError) as e:
            client.predict_request(req)
        _refused(e.value, grpc.StatusCode.INVALID_ARGUMENT, *words)
    assert srv.service.merger.rounds == rounds  # nothing refused was ever scored
    assert srv.service.refused["INVALID_ARGUMENT"] >= 5 and srv.service.refused["RESOURCE_EXHAUSTED"] >= 1
    # at the limits exactly: accepted
    ok = _columns(6, 64)
    assert len(client.predict_request(ok)[0]) == 6
    still_serving_v1(client, events, want)


class _CountingProxy:
    """A TCP proxy on 127.0.0.1 that counts the bytes a client sends through it to the server."""

    def __init__(self, target: str):
        import socket

        self.sent = 0
        host, _, port = target.rpartition(":")
        self._dst = (host, int(port))
        self._listen = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self._listen.getsockname()[1]}"
        self._socks = [self._listen]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket

        while True:
            try:
                conn, _ = self._listen.accept()
            except OSError:
                return
            up = socket.create_connection(self._dst)
            self._socks += [conn, up]
            threading.Thread(target=self._pipe, args=(conn, up, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, conn, False), daemon=True).start()

    def _pipe(self, src, dst, count: bool):
        try:
            while data := src.recv(1 << 16):
                if count:
                    self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass

    def close(self):
        for sock in self._socks:
            sock.close()


def test_an_over_limit_message_is_refused_after_one_flow_control_window(guarded):
    """gRPC refuses a message over serving.max_message_mb from its 5-byte length prefix; with BDP probing
    off (server.TRANSPORT_OPTIONS) the stream's receive window stays at 64 KiB, so the client cannot push
    the rest first (with gRPC's default, the whole 32 MB crossed the wire before the refusal). Legal
    requests larger than one window still go through, a window update at a time."""
    srv, trainer, touched, client, events, want = guarded  # serving.max_message_mb 1, max_request_kb 64
    proxy = _CountingProxy(srv.target)
    try:
        with grpc.insecure_channel(proxy.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            call = ch.unary_unary(PREDICT)
            md = (("authorization", "Bearer pred-tok"),)
            for _ in range(2):
                before = proxy.sent
                with pytest.raises(grpc.RpcError) as e:
                    call(b"\x0a" * (32 << 20), timeout=30, metadata=md)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert proxy.sent - before < (1 << 20) // 2, proxy.sent - before  # < half the 1 MiB limit itself
            # under the message limit, over max_request_kb: 900 KB cross, 14 windows, and are refused by name
            req = pb.PredictRequest()
            req.events.add(dense=[0.0] * 3, request_id="x" * 900_000)
            before = proxy.sent
            err = _raw(ch, PREDICT, req.SerializeToString())
            _refused(err, grpc.StatusCode.RESOURCE_EXHAUSTED, "serving.max_request_kb")
            assert proxy.sent - before > 900_000
            # and a good request through the proxy is answered
            ok = ServingClient(proxy.target, token="pred-tok")
            try:
                scores, version = ok.predict(events)
                assert version == 1 and np.allclose(scores, want, atol=1e-5)
            finally:
                ok.close()
    finally:
        proxy.close()
    still_serving_v1(client, events, want)


def test_a_flood_of_refused_calls_is_slowed_and_good_calls_are_not(guarded):
    """Past a burst of 10, an address refused more than 10 times a second gets its refusals
    serving.refusal_delay_ms late (a flood of bad calls slows to about 10 a second); a good call
    from the same address is never delayed."""
    srv, trainer, touched, client, events, want = guarded
    srv.settings.serving.refusal_delay_ms = 200
    took = []
    for _ in range(16):
        t0 = time.monotonic()
        _refused(_raw(client.channel, PREDICT, b"\xff\xff"), grpc.StatusCode.INVALID_ARGUMENT, "malformed")
        took.append(time.monotonic() - t0)
        if len(took) == 10:
            assert srv.service.delayed == 0  # the burst is answered as it comes
        if len(took) == 12:
            # a good call from the same address, mid-flood, is answered and never passes the refusal delay
            delayed, refused = srv.service.delayed, dict(srv.service.refused)
            still_serving_v1(client, events, want)
            assert srv.service.delayed == delayed and srv.service.refused == refused
    assert srv.service.delayed >= 2
    assert sum(took[10:]) >= 0.4, took  # the late refusals waited their 200 ms each (at least two of them)


def _gate(version, heavier_than: int = 0):
    """Make ``version`` block scoring batches of more than ``heavier_than`` events until released."""
    gate, entered = threading.Event(), threading.Semaphore(0)
    real = version.predict

    def predict(batch):
        if len(batch) > heavier_than:
            entered.release()
            assert gate.wait(30)
        return real(batch)

    version.predict = predict  # the instance attribute: every scoring path of this version comes here
    return gate, entered


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except grpc.RpcError as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_full_predict_lane_refuses_at_once_and_leaves_the_others_alone(cfg, tmp_path):
    cfg.serving.workers, cfg.serving.max_concurrent_requests, cfg.serving.merge_max_events = 2, 4, 0
    trainer, first = trained_once(cfg, tmp_path)
    events = make_events(cfg, 4)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        with SnapshotPusher(srv.target) as p:
            assert p.push(first).ok
        lane = srv.lanes.pools["predict"]
        gate, entered = _gate(srv.service.current)
        calls = [_in_thread(lambda: client.predict(events)) for _ in range(3)]  # 2 scoring, 1 waiting for a thread
        for _ in range(2):
            assert entered.acquire(timeout=10)
        deadline = time.time() + 10
        while lane.held < 3 and time.time() < deadline:
            time.sleep(0.01)
        # a client that gives up while its call waits for a thread: its place is held until a thread frees ...
        with pytest.raises(grpc.RpcError) as e:
            client.stub.Predict(pb.PredictRequest(), timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert lane.held == 4
        # refused at once, not queued: every scoring thread is held by the closed gate (opened below), so a queued
        # call could not be answered before it opens
        with pytest.raises(grpc.RpcError) as e:
            client.predict(events)
        _refused(e.value, grpc.StatusCode.RESOURCE_EXHAUSTED, "serving.max_concurrent_requests (4)")
        # the other lanes answer while Predict's is full
        assert client.health() == "SERVING" and int(client.status()["version"]) == 1
        changed = trainer.step()
        with SnapshotPusher(srv.target) as p:
            assert p.push(trainer.snapshot("delta", changed)).ok
        gate.set()
        for t, out in calls:
            t.join(20)
            assert out.get("value") is not None and out["value"][1] in (1, 2), out
        deadline = time.time() + 10
        while lane.held and time.time() < deadline:
            time.sleep(0.01)
        assert lane.held == 0  # ... and every call is counted out, the abandoned one included
        assert client.predict(events)[1] == 2
    trainer.close()


def test_heavy_requests_are_scored_apart_one_at_a_time(cfg, tmp_path):
    cfg.serving.heavy_request_cost, cfg.serving.max_concurrent_heavy = 100, 1
    trainer, first = trained_once(cfg, tmp_path)
    events = make_events(cfg, 40)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        with SnapshotPusher(srv.target) as p:
            assert p.push(first).ok
        gate, entered = _gate(srv.service.current, heavier_than=20)
        rounds = srv.service.merger.rounds
        t, out = _in_thread(lambda: client.predict(events))  # 40 events + their ids > 100: heavy
        assert entered.acquire(timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            client.predict(events)
        _refused(e.value, grpc.StatusCode.RESOURCE_EXHAUSTED, "serving.heavy_request_cost", "serving.max_concurrent_heavy (1)")
        scores, version = client.predict(events[:3])  # an ordinary request is not held behind the heavy one
        assert version == 1 and len(scores) == 3
        gate.set()
        t.join(20)
        assert len(out["value"][0]) == 40
        assert srv.service.merger.rounds == rounds + 1  # only the ordinary request went through a merged round
    trainer.close()


def test_heavy_slices_cover_the_batch_in_order():
    from streamrec.foundation import EventBatch, JaggedIds
    from streamrec.serving.server import heavy_slices

    lengths = np.array([1000, 1000, 1000, 5000, 0, 3, 2000])
    ids = JaggedIds(np.arange(lengths.sum()), np.concatenate([[0], np.cumsum(lengths)]))
    batch = EventBatch(ts=np.zeros(7, np.int64), labels=np.zeros(7, np.float32), dense=np.zeros((7, 1), np.float32),
                       sparse={"a": ids})
    sl = heavy_slices(batch, 2048)
    assert sl[0][0] == 0 and sl[-1][1] == 7 and all(a < b for a, b in sl)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(sl, sl[1:]))  # contiguous, in order
    assert (3, 4) in sl  # the 5,000-id event is a slice of its own
    assert sl == [(0, 2), (2, 3), (3, 4), (4, 7)]  # greedy: each at most 2,048 ids + events unless one event is more
    assert heavy_slices(batch.take(np.arange(0)), 2048) == [(0, 0)]


def test_a_heavy_request_is_scored_in_slices_with_the_same_scores(cfg, tmp_path, monkeypatch):
    from streamrec.serving import server as server_mod

    cfg.serving.heavy_request_cost = 100
    trainer, first = trained_once(cfg, tmp_path)
    events = make_events(cfg, 40)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        with SnapshotPusher(srv.target) as p:
            assert p.push(first).ok
        whole, _ = client.predict(events)  # 40 events + their ids > 100: heavy, one slice at the default size
        n = srv.service.heavy_slices
        assert n == 1
        monkeypatch.setattr(server_mod, "HEAVY_SLICE_IDS", 20)
        sliced, version = client.predict(events)
        assert version == 1 and srv.service.heavy_slices - n >= 5
        assert np.allclose(sliced, whole, atol=1e-6)
        assert np.allclose(whole, trainer.scores(events_to_batch(cfg, events)), atol=1e-5)
        # a heavy request its decoding refuses is refused by name, from the heavy worker
        bad = [dict(e, dense=[3e38, 0.0, 0.0]) if i == 7 else e for i, e in enumerate(events)]
        with pytest.raises(grpc.RpcError) as e:
            client.predict(bad)
        _refused(e.value, grpc.StatusCode.INVALID_ARGUMENT, "event 7", "ingest.dense_abs_max")
        # the heavy worker runs at a lower OS priority (Linux: nice is per thread)
        if sys.platform.startswith("linux"):
            worker = [t for t in threading.enumerate() if t.name.startswith("heavy")]
            assert worker and all(os.getpriority(os.PRIO_PROCESS, t.native_id) == server_mod.HEAVY_NICE for t in worker)
        assert client.predict(events[:3])[1] == 1
    trainer.close()


def test_a_score_is_never_nan(cfg, tmp_path):
    """Finite weights (checked on push) and dense values within the ingest bound can still overflow a
    model with huge weights: such a score is refused, naming the event, never answered as NaN."""
    cfg.ingest.dense_abs_max = 3e38
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    with torch.no_grad():
        trainer.model.bottom[0].weight.mul_(1e12)
    events = make_events(cfg, 3)
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        with SnapshotPusher(srv.target) as p:
            assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        scores, _ = client.predict(events)
        assert np.isfinite(scores).all()
        with pytest.raises(grpc.RpcError) as e:
            client.predict([events[0], dict(events[1], dense=[1e38, -1e38, 1e38])])
        _refused(e.value, grpc.StatusCode.INVALID_ARGUMENT, "events[1]", "not a number")
    trainer.close()


# -- validated pushes ---------------------------------------------------------------------------

def _manifest(snap: Path) -> dict:
    return json.loads((snap / "manifest.json").read_text())


def test_bad_manifests_are_refused_before_any_byte_is_stored(guarded):
    """Sent as raw streams (a client other than ours; our pusher refuses most of these locally)."""
    srv, trainer, touched, client, events, want = guarded
    snap = trainer.snapshot("delta", trainer.step())
    chunks = list(snapshot_chunks(snap))
    good = _manifest(snap)
    dense = good["files"]["dense.safetensors"]

    def with_files(name):
        return {**good, "files": {**good["files"], name: dense}}

    deep: dict = {}
    for _ in range(50):
        deep = {"x": deep}
    cases = [
        (with_files(""), "bad file name"),
        (with_files("a\x00b"), "bad file name"),
        (with_files("x" * 300), "bad file name"),
        (with_files("../escape"), "bad file name"),
        ({**good, "kafka_offsets": deep}, "nested deeper"),
        ({**good, "model_config": {**good["model_config"], "dense_dim": 10**12}}, "serving.max_model_params"),
        ({**good, "model_config": {**good["model_config"], "top_mlp": [10**9]}}, "serving.max_model_params"),
        ({**good, "model_config": {**good["model_config"], "top_mlp": [0]}}, "at least 1 unit"),
        ({**good, "model_config": {**good["model_config"], "fields": [{"name": f"f{i}"} for i in range(2000)]}},
         "serving.max_model_fields"),
        ({**good, "model_config": {**good["model_config"], "fields": [{"name": "a\x00b"}]}}, "not a valid field name"),
        ({**good, "model_config": {**good["model_config"], "embedding_dim": 10**6, "bottom_mlp": [16, 10**6]}},
         "serving.max_embedding_dim"),
        ({**good, "version": 2**63 - 1}, "version"),
        ({**good, "version": 1 + srv.settings.serving.max_version_jump + 1}, "serving.max_version_jump"),
        ({**good, "store_config": {"init_scale": 1e300}}, "init_scale"),
    ]
    raw_cases = [(b"[" * 100_000, "nested deeper"), (b'{"format": 1, "version": NaN}', "finite"),
                 (b'{"format": 1, "version": ' + b"9" * 5000 + b"}", "not valid JSON")]
    for manifest, words in [(json.dumps(m).encode(), w) for m, w in cases] + raw_cases:
        err = push_stream(srv.target, [pb.SnapshotChunk(manifest_json=manifest), *chunks[1:]], token="push-tok")
        _refused(err, grpc.StatusCode.INVALID_ARGUMENT, words)
    assert list((Path(srv.settings.serving.data_dir) / "staging").iterdir()) == []
    still_serving_v1(client, events, want)
    with SnapshotPusher(srv.target, token="push-tok") as p:
        assert p.push(snap).ok  # the good one still goes in
    # a manifest over MAX_MANIFEST_BYTES (4 MiB; more than this server's 1 MiB messages carry anyway)
    from streamrec.snapshot import Manifest, SnapshotError
    from streamrec.snapshot.format import MAX_MANIFEST_BYTES

    with pytest.raises(SnapshotError, match="bytes, the limit"):
        Manifest.from_json(b" " * (MAX_MANIFEST_BYTES + 1))


def test_refused_pushes_are_not_retried_and_the_old_version_keeps_serving(guarded, tmp_path):
    srv, trainer, touched, client, events, want = guarded

    def variant(name: str, patch=None, dense=None, rows=None) -> Path:
        """A full snapshot of the trainer's model, changed: manifest keys, dense tensors or row vectors."""
        state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if dense:
            dense(state)
        from streamrec.snapshot import empty_evidence, rows_batch, write_snapshot

        batches = []
        for f, ids in touched.rows():
            vec = trainer.store.peek(f, ids).numpy().copy()
            if rows:
                rows(vec)
            batches.append(rows_batch(f, ids, vec))
        d = write_snapshot(tmp_path / name, version=patch.pop("version", 2) if patch else 2, parent_version=None,
                           kind="full", dense_state=state, rows=batches, kafka_offsets={}, metrics={},
                           config_hash=trainer.cfg.model_hash(), newest_event_ms=0,
                           model_config=trainer.cfg.to_dict()["model"], store_config={"init_scale": 0.05}, evidence=empty_evidence())
        if patch:
            m = _manifest(d)
            m.update(patch)
            (d / "manifest.json").write_text(json.dumps(m))
        return d

    def nan_weight(state):
        next(iter(state.values())).view(-1)[0] = float("nan")

    def inf_weight(state):
        next(iter(state.values())).view(-1)[-1] = float("inf")

    def nan_row(vec):
        vec[3, 1] = float("nan")

    jump = srv.settings.serving.max_version_jump
    cases = [
        (variant("nan-weight", dense=nan_weight), "INVALID_ARGUMENT", "non-finite"),
        (variant("inf-weight", dense=inf_weight), "INVALID_ARGUMENT", "non-finite"),
        (variant("nan-row", rows=nan_row), "INVALID_ARGUMENT", "non-finite"),
        (variant("far-ahead", {"version": 2 + jump}), "INVALID_ARGUMENT", "serving.max_version_jump"),
        (variant("huge-model", {"model_config": {**trainer.cfg.to_dict()["model"], "top_mlp": [10**9]}}),
         "INVALID_ARGUMENT", "serving.max_model_params"),
        (variant("not-newer", {"version": 1}), "FAILED_PRECONDITION", "not newer"),
    ]
    with SnapshotPusher(srv.target, token="push-tok", attempts=4, backoff_s=0.01) as p:
        for snap, code, words in cases:
            r = p.push(snap)
            assert not r.ok and r.code == code and words in r.reason and r.attempts == 1, (snap.name, r)
            still_serving_v1(client, events, want)
        assert int(client.status()["version"]) == 1
        assert list((Path(srv.settings.serving.data_dir) / "staging").iterdir()) == []
        assert [d.name for d in (Path(srv.settings.serving.data_dir) / "versions").iterdir()] == ["v000000000001"]
        assert p.push(variant("good")).ok and int(client.status()["version"]) == 2


def test_the_trainers_publisher_drops_a_snapshot_refused_for_good(cfg, tmp_path):
    """The publisher retries what may pass on a retry; a snapshot refused as INVALID_ARGUMENT (NaN
    weights) is pushed once and dropped, and the next snapshot (built on the last accepted version)
    goes through."""
    from streamrec.trainer.snapshots import SnapshotPublisher

    cfg.serving.push_token = "tok"
    trainer = FakeTrainer(cfg, tmp_path)
    pushes = []

    def factory(target):
        pusher = SnapshotPusher.factory(cfg.serving)(target)
        real = pusher.push

        def push(path):
            r = real(path)
            pushes.append(r.code)
            return r

        pusher.push = push
        return pusher

    with serve(server_settings(cfg), device="cpu") as srv:
        cfg.serving.target = srv.target
        pub = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snapshots",
                                model_hash=cfg.model_hash(), targets=cfg.push_targets(),
                                push=True, backoff_s=0.05, max_backoff_s=0.1,
                                pusher_factory=factory)
        try:
            for version in (1, 2):
                trainer.step()
                if version == 1:
                    with torch.no_grad():
                        next(trainer.model.parameters()).view(-1)[0] = float("nan")
                else:
                    with torch.no_grad():
                        next(trainer.model.parameters()).view(-1)[0] = 0.0
                epoch = trainer.store.checkpoint(str(tmp_path / f"ckpt-{version}"))
                assert pub.publish(version, epoch, trainer.store, trainer.model, {}, {}, trainer.newest_event_ms)
                assert pub.wait_idle(20)
                if version == 1:
                    time.sleep(0.3)  # a retry, were there one, would come within the backoff
                    assert pushes == ["INVALID_ARGUMENT"] and pub.version == 0 and "non-finite" in pub.st.last_error
            assert pushes == ["INVALID_ARGUMENT", "OK"] and pub.version == 2
            assert pub.st.history == [(1, "full"), (2, "full")]  # nothing accepted before: the next is full
        finally:
            pub.close()
    trainer.close()


# -- safe defaults ------------------------------------------------------------------------------

def test_an_open_push_endpoint_on_the_network_needs_insecure_push(cfg, capsys):
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "serving", "example.com"):
        assert not is_loopback(host), host
    cfg.serving.host = "0.0.0.0"
    with pytest.raises(ConfigError, match="--insecure-push"):
        ServingServer(server_settings(cfg), device="cpu", port=0)
    from streamrec.app.cli import main

    code = main(["serve", "--set", "serving.host=0.0.0.0", "--set", "serving.port=0",
                 "--set", f"serving.data_dir={cfg.serving.data_dir}"])
    assert code == 2 and "serving.push_token is empty" in capsys.readouterr().err
    with ServingServer(server_settings(cfg), device="cpu", port=0, insecure_push=True) as srv:
        assert any("INSECURE" in w for w in srv.warnings)
    cfg.serving.push_token = "t"
    with ServingServer(server_settings(cfg), device="cpu", port=0) as srv:
        assert srv.warnings and "plaintext" in srv.warnings[0]  # a token over plaintext on the network: warned


@pytest.mark.subprocess
def test_serve_with_insecure_push_warns_on_start(cfg, tmp_path):
    env = dict(os.environ, STREAMREC_SERVING__DATA_DIR=str(tmp_path / "srv"))
    proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--port", "0", "--device", "cpu",
                             "--set", "serving.host=0.0.0.0", "--insecure-push", "--log-level", "ERROR"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        target = proc.stdout.readline().strip()
        assert target.startswith("0.0.0.0:"), target
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "WARNING: INSECURE: serving.push_token is empty" in err, err


def test_metrics_endpoint_binds_loopback_by_default(cfg):
    from streamrec.ingest import free_port
    from streamrec.trainer.telemetry import PrometheusExporter

    assert cfg.trainer.metrics_host == "127.0.0.1"
    exp = PrometheusExporter(free_port(), cfg.trainer.metrics_host)
    try:
        assert exp.server.server_address[0] == "127.0.0.1"
    finally:
        exp.close()


def test_status_can_require_the_predict_token_health_and_reflection_never_do(guarded):
    srv, trainer, touched, client, events, want = guarded
    with ServingClient(srv.target) as anon:
        assert int(anon.status()["version"]) == 1  # by default Status is open ...
        srv.settings.serving.status_needs_token = True  # ... and can be guarded
        with pytest.raises(grpc.RpcError) as e:
            anon.status()
        _refused(e.value, grpc.StatusCode.UNAUTHENTICATED, "serving.status_needs_token")
        assert int(client.status()["version"]) == 1  # with the predict token
        assert anon.health() == "SERVING"
        assert _list_services(anon.channel, "grpc.reflection.v1.ServerReflection")


# -- reflection, health, lanes ------------------------------------------------------------------

def _reflect(channel, service: str, *requests):
    call = channel.stream_stream(f"/{service}/ServerReflectionInfo",
                                 request_serializer=refl.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=refl.ServerReflectionResponse.FromString)
    return list(call(iter(requests), timeout=10))


def _list_services(channel, service: str) -> list[str]:
    (resp,) = _reflect(channel, service, refl.ServerReflectionRequest(list_services=""))
    return sorted(s.name for s in resp.list_services_response.service)


def test_reflection_v1_and_v1alpha_and_health_until_a_model_is_installed(cfg, tmp_path):
    from google.protobuf import descriptor_pb2

    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        health = health_pb2_grpc.HealthStub(client.channel)
        for service in ("", "streamrec.v1.StreamRec"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
        st = client.status()
        assert st["serving"] is False and (st["process"], st["processes"]) == (0, 1)  # a lone server
        want = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection", "streamrec.v1.StreamRec"]
        for version in ("v1", "v1alpha"):
            service = f"grpc.reflection.{version}.ServerReflection"
            assert _list_services(client.channel, service) == want
            files = _reflect(client.channel, service,
                             refl.ServerReflectionRequest(file_containing_symbol="streamrec.v1.StreamRec"),
                             refl.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"))
            names = []
            for resp in files:
                for blob in resp.file_descriptor_response.file_descriptor_proto:
                    names.append(descriptor_pb2.FileDescriptorProto.FromString(blob).name)
            assert "streamrec/serving/streamrec.proto" in names and "grpc/reflection/v1/reflection.proto" in names
        with SnapshotPusher(srv.target) as p:
            assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        assert client.health() == "SERVING" and client.health("streamrec.v1.StreamRec") == "SERVING"
    cfg.serving.reflection = False
    with serve(server_settings(cfg), device="cpu") as srv, ServingClient(srv.target) as client:
        with pytest.raises(grpc.RpcError) as e:
            _list_services(client.channel, "grpc.reflection.v1.ServerReflection")
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    trainer.close()


def test_long_lived_streams_cannot_take_the_other_lanes_threads(guarded):
    """health Watch needs no token and holds its call open: the streams' lane fills, the rest answers."""
    from streamrec.serving.server import STREAM_LANE

    srv, trainer, touched, client, events, want = guarded
    health = health_pb2_grpc.HealthStub(client.channel)
    watches = []
    try:
        for _ in range(STREAM_LANE[1]):
            w = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
            assert next(w).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(w)
        with pytest.raises(grpc.RpcError) as e:
            next(health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10))
        _refused(e.value, grpc.StatusCode.RESOURCE_EXHAUSTED, "Watch")
        still_serving_v1(client, events, want)
        assert client.health() == "SERVING" and int(client.status()["version"]) == 1
        changed = trainer.step()
        with SnapshotPusher(srv.target, token="push-tok") as p:
            assert p.push(trainer.snapshot("delta", changed)).ok
    finally:
        for w in watches:
            w.cancel()
