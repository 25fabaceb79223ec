"""Predict refusals: no token, bad request fields (per-event and column forms, malformed
columns), too many events, and a message over gRPC's own size limit. Each gets its status
code and names the field at fault, and the server goes on answering good requests."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, events_to_request, serve
from streamrec.app.wiring import server_settings
from tests.helpers.serving import FakeTrainer, Touched, make_events, still_serving_v1

pytestmark = pytest.mark.grpc


def test_predict_refusals(loaded):
    srv, trainer, touched, client, events, want = loaded
    with ServingClient(srv.target) as anon:
        with pytest.raises(grpc.RpcError) as e:
            anon.predict(events)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    dd = trainer.cfg.model.dense_dim
    cases = [  # (event, field named in the per-event form, in the column form)
        (dict(events[0], dense=[1.0]), "events[0].dense", "columns.dense"),
        (dict(events[0], sparse={"nosuch": [1]}), "events[0].sparse", "columns.sparse"),
        (dict(events[0], dense=[float("nan")] * dd), "events[0].dense", "columns.dense"),
    ]
    for ev, field, col_field in cases:
        for columns, name in ((False, field), (True, col_field)):
            with pytest.raises(grpc.RpcError) as e:
                client.predict([ev], columns=columns)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    for evs, columns, name in (([], False, "events: empty"), (events * 3, False, "events: 60 events"),
                               ([], True, "columns.size: 0"), (events * 3, True, "columns.size: 60 events")):
        with pytest.raises(grpc.RpcError) as e:
            client.predict(evs, columns=columns)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    # malformed columns: lengths that do not add up (bytes and packed form), torn bytes, two forms at once
    req = events_to_request(events[:3])
    lens = np.frombuffer(req.columns.sparse["user"].lengths_u32, "<u4").copy()
    lens[0] += 1
    req.columns.sparse["user"].lengths_u32 = lens.tobytes()
    packed = events_to_request(events[:3])
    for name, col in packed.columns.sparse.items():
        col.values.extend(np.frombuffer(col.values_i64, "<i8").tolist())
        col.lengths.extend(np.frombuffer(col.lengths_u32, "<u4").tolist())
        col.values_i64, col.lengths_u32 = b"", b""
    packed.columns.dense.extend(np.frombuffer(packed.columns.dense_f32, "<f4").tolist())
    packed.columns.dense_f32 = b""
    assert np.array_equal(client.predict_request(packed)[0], client.predict(events[:3])[0])
    packed.columns.sparse["user"].lengths[0] += 1
    torn = events_to_request(events[:3])
    torn.columns.dense_f32 = torn.columns.dense_f32[:-1]
    twice = events_to_request(events[:3])
    twice.columns.dense.append(0.0)
    both = events_to_request(events[:3])
    both.events.extend(events_to_request(events[:1], columns=False).events)
    for r, name in ((req, "columns.sparse[user].values"), (packed, "columns.sparse[user].values"),
                    (torn, "columns.dense_f32"), (twice, "columns.dense_f32: send dense or dense_f32"),
                    (both, "either events or columns")):
        with pytest.raises(grpc.RpcError) as e:
            client.predict_request(r)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in e.value.details(), e.value.details()
    assert np.array_equal(client.predict(events, columns=False)[0], client.predict(events)[0])
    still_serving_v1(client, events, want)
    st = client.status()
    assert int(st["version"]) == 1


def test_message_limit_is_grpcs_own(cfg, tmp_path):
    cfg.serving.max_message_mb = 1
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target) as p, ServingClient(srv.target) as c:
        assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        events = make_events(cfg, 8)
        big = dict(events[0], request_id="x" * (2 << 20))
        with pytest.raises(grpc.RpcError) as e:
            c.predict([big])
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.predict(events)[1] == 1  # still answers
    trainer.close()
