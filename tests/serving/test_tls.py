"""TLS: a server with a certificate serves clients that trust it, and a plaintext client cannot
talk to it. The self-signed certificate is made with the openssl CLI (skipped without it)."""

from __future__ import annotations

import shutil
import subprocess

import grpc
import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]


def _self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found (needed to make a self-signed test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls(cfg, tmp_path):
    cert, key = _self_signed(tmp_path)
    cfg.serving.tls_cert, cfg.serving.tls_key = str(cert), str(key)
    trainer = FakeTrainer(cfg, tmp_path)
    touched = Touched()
    touched.add(trainer.step())
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target, tls_ca=str(cert)) as p:
            assert p.push(trainer.snapshot("full", [], touched.rows())).ok
        events = make_events(cfg, 8)
        with ServingClient(srv.target, tls_ca=str(cert)) as c:
            scores, version = c.predict(events)
        assert version == 1
        assert np.max(np.abs(scores - trainer.scores(events_to_batch(cfg, events)))) <= 1e-6
        with ServingClient(srv.target, timeout=3) as plain:  # a plaintext client cannot talk to it
            with pytest.raises(grpc.RpcError) as e:
                plain.predict(events)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.stop(0.5)
        trainer.close()
