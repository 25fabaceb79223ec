"""What model lines cost the Predict handler at batch 512 (``streamrec bench serve``'s
``shadow_vs_single_b512`` and ``split_vs_single_b512``).

Three in-process services (``StreamRecService``, each its own data directory) run the whole Predict handler
(parse, route, decode, merge, score, reply) on the same batch-512 request bytes, no gRPC: one with the main
line alone; one with a shadow line (``serving.shadow_line``), whose scoring runs on its own thread after each
answer, so a chunk's time runs until the shadow has scored every request of the chunk (nothing skipped:
``serving.shadow_max_pending`` covers a chunk); one with a 50/50 split (``[[serving.experiments]]``) over two
lines, the requests' first users chosen so that half go to each. Each line serves the same snapshot (its
manifest's ``model_line`` changed), so the work per request is the same and only the lines' overhead differs.
They are measured in alternating chunks; a ratio is the median chunk's throughput over the single line's.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from streamrec.app.config import load_config
from streamrec.serving.serving_config import ExperimentSpec
from streamrec.serving import ServerSettings, Split, split_key

CHUNK = 10  # calls per timed chunk
WARM = 5  # untimed passes over the requests before the chunks


def _as_line(snap: Path, line: str, out: Path) -> Path:
    """A copy of snapshot ``snap`` that names model line ``line`` (the manifest's own bytes carry no checksum)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(snap, out)
    m = json.loads((out / "manifest.json").read_text())
    m["model_line"] = line
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def _with_user(request, field: str, user: int):
    """A copy of a column-wise request whose first event's first id of ``field`` is ``user``."""
    r = type(request)()
    r.CopyFrom(request)
    col = r.columns.sparse[field]
    if col.values_i64:
        col.values_i64 = int(user).to_bytes(8, "little", signed=True) + col.values_i64[8:]
    else:
        col.values[0] = int(user)
    return r


def line_costs(tmp: Path, snap: Path, overrides: dict, dev, request, ctx, rounds: int, warm: int = WARM) -> dict:
    """The three services' handler throughput at the request's batch (see the module docstring), after ``warm``
    untimed passes over the requests."""
    from streamrec.serving.server import StreamRecService
    from streamrec.snapshot import verify_snapshot

    base = {k: v for k, v in overrides.items() if not k.startswith("serving.data_dir")}
    field = "user"
    split = Split([ExperimentSpec("main", 0.5), ExperimentSpec("b", 0.5)], field)
    users = {"main": [], "b": []}
    for u in range(1, 10_000):
        users[split.line_for_key(u)].append(u)
        if min(len(x) for x in users.values()) >= 4:
            break
    variants = [_with_user(request, field, users[n][i]) for i in range(4) for n in ("main", "b")]
    assert [split.line_for(r) for r in variants] == ["main", "b"] * 4 and split_key(variants[0], field)
    blobs = [r.SerializeToString() for r in variants]
    kinds = {
        "single": ({}, ["main"]),
        "shadow": ({"serving.shadow_line": "shadow", "serving.shadow_max_pending": 4 * CHUNK}, ["main", "shadow"]),
        "split": ({"serving.experiments": [{"line": "main", "share": 0.5}, {"line": "b", "share": 0.5}]},
                  ["main", "b"]),
    }
    services = {}
    try:
        for name, (extra, lines) in kinds.items():
            cfg = load_config(None, {**base, **extra, "serving.data_dir": str(tmp / f"lines-{name}")}, env={})
            svc = services[name] = StreamRecService(ServerSettings(cfg.serving, cfg.store, cfg.ingest.dense_abs_max),
                                                    dev)
            for line in lines:
                s = snap if line == "main" else _as_line(snap, line, tmp / f"snap-{name}-{line}")
                svc.install(s, verify_snapshot(s))
        chunks: dict[str, list[float]] = {k: [] for k in kinds}
        for name, svc in services.items():  # warm every version (a frozen program specialises on its first calls)
            for b in blobs * warm:
                svc.Predict(b, ctx)
            svc.lines.drain(60)
        for _ in range(rounds):
            for name, svc in services.items():
                t0 = time.perf_counter()
                for i in range(CHUNK):
                    svc.Predict(blobs[i % len(blobs)], ctx)
                svc.lines.drain(60)
                chunks[name].append(CHUNK / (time.perf_counter() - t0))
        qps = {k: float(np.median(v)) for k, v in chunks.items()}
        sh = services["shadow"].lines
        answered = services["split"].lines.stats
        return {"single_handler_qps_b512": qps["single"], "shadow_handler_qps_b512": qps["shadow"],
                "split_handler_qps_b512": qps["split"],
                "shadow_vs_single_b512": qps["shadow"] / qps["single"],
                "split_vs_single_b512": qps["split"] / qps["single"],
                "shadow_skipped": sh.shadow_skipped, "shadow_scored": sum(p.requests for p in sh.pairs.values()),
                "split_answered": {n: s.requests for n, s in answered.items()}}
    finally:
        for svc in services.values():
            svc.close()
