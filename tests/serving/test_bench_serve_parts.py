"""The in-process parts ``streamrec bench serve`` measures the one-client latency's floor with: the
service's own Predict handler called without gRPC, and the idle-gap timing loop."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from streamrec.benchmarks.bench_serve import _LocalContext, idle_gap_latency
from streamrec.serving import events_to_request
from streamrec.app.wiring import server_settings
from streamrec.serving.pb import pb
from streamrec.serving.server import StreamRecService
from streamrec.snapshot import verify_snapshot
from tests.helpers.serving import events_to_batch, make_events, trained_once


def test_idle_gap_latency_times_the_call_and_idles_between_calls():
    t0 = time.perf_counter()
    got = idle_gap_latency(lambda: time.sleep(0.002), 0.003, 10)
    took = time.perf_counter() - t0
    assert 2.0 <= got["p50"] <= got["p99"]  # each call slept 2 ms; the gaps are not counted
    assert took >= 30 * 0.005  # 10 timed calls + 20 warm-up calls, each after a 3 ms gap


def test_the_handler_in_process_scores_as_the_trainer_and_refuses_as_over_grpc(cfg, tmp_path):
    trainer, snap = trained_once(cfg, tmp_path)
    svc = StreamRecService(server_settings(cfg), torch.device("cpu"))
    try:
        svc.install(snap, verify_snapshot(snap))
        events = make_events(cfg, 16)
        resp = svc.Predict(events_to_request(events).SerializeToString(), _LocalContext())
        assert isinstance(resp, pb.PredictResponse) and resp.model_version == svc.current.version
        np.testing.assert_allclose(np.asarray(resp.scores), trainer.scores(events_to_batch(cfg, events)), rtol=1e-5,
                                   atol=1e-6)
        with pytest.raises(RuntimeError, match="INVALID_ARGUMENT.*malformed protobuf"):
            svc.Predict(b"\xff\xff\xff", _LocalContext())
    finally:
        svc.close()
        trainer.close()
