"""Predict throughput at batch 512 with one vs several ``streamrec serve`` processes on this host.

Why: one server process runs its Python (gRPC's and ours) under one GIL, so it uses
about one core however many handler threads it has. This measures what running
several replicas on one host buys (clients split evenly across them, as a gRPC load
balancer would), against the bare in-process forward measured in the same run.

    .venv/bin/python -m streamrec.benchmarks.serve_replicas [--replicas 2] [--clients 16] [--seconds 5] [--rounds 2]

Each replica gets its own data directory and its own push of the same full snapshot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from streamrec.benchmarks.bench_serve import build_state

BATCH = 512


def _start(tmp: Path, i: int, snap: Path) -> tuple[subprocess.Popen, str]:
    from streamrec.serving import SnapshotPusher

    env = dict(os.environ, STREAMREC_SERVING__DATA_DIR=str(tmp / f"serving-{i}"), STREAMREC_SERVING__PUSH_TOKEN="bench",
               STREAMREC_SERVING__WORKERS="16", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--port", "0", "--device", "cpu",
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)
    target = proc.stdout.readline().strip()
    if not target:
        proc.kill()
        raise RuntimeError(f"replica {i} did not start")
    r = SnapshotPusher(target, token="bench").push(snap)
    if not r.ok:
        proc.kill()
        raise RuntimeError(f"replica {i} refused the snapshot: {r}")
    return proc, target


def _load(targets: list[str], request, clients: int, seconds: float) -> float:
    """Predict calls/s of ``clients`` threads, client i on ``targets[i % len(targets)]``."""
    from streamrec.serving import ServingClient

    counts = [0] * clients
    stop = threading.Event()

    def run(i):
        with ServingClient(targets[i % len(targets)], timeout=30) as cl:
            cl.predict_request(request)
            while not stop.is_set():
                cl.predict_request(request)
                counts[i] += 1

    ths = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in ths:
        t.start()
    time.sleep(0.5)
    n0, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    n1, el = sum(counts), time.perf_counter() - t0
    stop.set()
    for t in ths:
        t.join(30)
    return (n1 - n0) / el


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamrec.benchmarks.serve_replicas", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2, help="alternate one / several replicas this many times")
    args = ap.parse_args(argv)

    from streamrec.ingest import SyntheticStream
    from streamrec.snapshot import empty_evidence, write_snapshot
    from streamrec.serving import events_to_request
    from streamrec.app.config import load_config
    from streamrec.model import embed_batch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    procs: list[subprocess.Popen] = []
    try:
        cfg = load_config(None, {"store.path": str(tmp / "store"), "hot.budget_rows": 100_000}, env={})
        fields = cfg.model.field_names
        model, store, rng = build_state(cfg, tmp, 20_000)
        events = next(iter(SyntheticStream(cfg).batches(4096)))
        for f in fields:
            ids = np.unique(events.sparse[f].values)
            store.upsert_rows(f, ids, rng.standard_normal((len(ids), cfg.model.embedding_dim)).astype(np.float32) * 0.05)
        snap = write_snapshot(tmp / "snap", version=1, parent_version=None, kind="full", dense_state=model.state_dict(),
                              rows=list(store.changed_rows()), kafka_offsets={}, metrics={},
                              config_hash=cfg.model_hash(), newest_event_ms=int(time.time() * 1000),
                              model_config=cfg.to_dict()["model"], store_config={"init_scale": cfg.store.init_scale}, evidence=empty_evidence())
        sub = events.take(np.arange(BATCH))
        request = events_to_request(sub.to_events())

        pooled, _ = embed_batch(sub, fields, lambda f, i: store.peek(f, i), torch.device("cpu"))
        dense = torch.from_numpy(sub.dense)
        with torch.no_grad():
            model(dense, pooled)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                model(dense, pooled)
                n += 1
        forward = n / (time.perf_counter() - t0)
        print(f"bare forward in-process, batch {BATCH}: {forward:.0f} req/s (baseline)", flush=True)

        started = [_start(tmp, i, snap) for i in range(args.replicas)]
        procs = [p for p, _ in started]
        targets = [t for _, t in started]
        for r in range(args.rounds):
            one = _load(targets[:1], request, args.clients, args.seconds)
            many = _load(targets, request, args.clients, args.seconds)
            print(f"round {r + 1}: {args.clients} clients, batch {BATCH}: 1 replica {one:.0f} req/s "
                  f"({one / forward:.3f}x the forward); {args.replicas} replicas {many:.0f} req/s "
                  f"({many / forward:.3f}x the forward, {many / one:.2f}x one replica)", flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
