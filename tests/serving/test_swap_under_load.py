"""Swap under load: client threads call Predict continuously while five snapshots
(full and delta) are pushed. Zero failed requests, every response comes from a
pushed version and matches that version's scores exactly (never a half-loaded
model), and each client's versions never go backwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from tests.helpers.serving import FakeTrainer, Touched, events_to_batch, make_events
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.grpc

KINDS = ["full", "delta", "delta", "full", "delta"]


def test_swap_under_load(cfg, tmp_path):
    cfg.serving.push_token = "t"
    cfg.serving.hot_rows = 500  # some rows in memory, the rest only in the store: both paths score
    trainer = FakeTrainer(cfg, tmp_path)
    events = make_events(cfg, 32, seed=11)
    batch = events_to_batch(cfg, events)
    touched = Touched()
    snaps, expected = [], {}
    for kind in KINDS:  # prepare every version and its exact scores up front
        changed = trainer.step(n_rows=300)
        touched.add(changed)
        snaps.append(trainer.snapshot(kind, changed, touched.rows()))
        expected[trainer.version] = trainer.scores(batch)
    trainer.close()

    srv = serve(server_settings(cfg), device="cpu")
    pusher = SnapshotPusher(srv.target, token="t", chunk_bytes=8192)
    assert pusher.push(snaps[0]).ok
    stop = threading.Event()
    results: list[list] = [[] for _ in range(4)]
    failures: list = []

    def hammer(i: int) -> None:
        with ServingClient(srv.target, timeout=20) as c:
            while not stop.is_set():
                try:
                    scores, version = c.predict(events)
                    results[i].append((version, float(np.max(np.abs(scores - expected[version])))))
                except Exception as e:  # any failure counts; KeyError = unknown version
                    failures.append(repr(e))

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    def every_client_has(version: int):  # each client's newest answer came from ``version``
        return lambda: failures or all(res and res[-1][0] == version for res in results)

    try:
        pushed = [1]
        wait_until(every_client_has(1), 20, "every client answered by version 1")
        for snap in snaps[1:]:
            r = pusher.push(snap)
            assert r.ok, r
            pushed.append(r.version)
            # the swap happens while the clients call; the next push waits until each has been answered by it
            wait_until(every_client_has(r.version), 20, f"every client answered by version {r.version}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        pusher.close()
        srv.stop(0.5)
    assert pushed == [1, 2, 3, 4, 5]
    assert failures == []
    seen = set()
    for res in results:
        versions = [v for v, _ in res]
        assert len(versions) > 5
        assert versions == sorted(versions), "a client saw the version go backwards"
        assert versions[-1] == 5
        assert max(d for _, d in res) <= 1e-6, "a response did not match its version's model"
        seen.update(versions)
    assert seen == set(pushed)  # every version served, none other
