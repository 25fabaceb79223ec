"""``streamrec bench tables``: what lean tables (admission by frequency, compressed rows, a row cap) save in
stored rows and bytes, and what they cost in AUC. One run, every ratio against a baseline of the same run,
the same events and model seed for every setting of a stream. In-process ``TrainerCore`` (Kafka left out),
hot tier off (``hot.budget_rows = 0``), so every row lives in the RocksDB cold tier and is counted there.

Streams: ``synthetic`` (the default generator with the user and item tables at 10M ids each, their Zipf skews
unchanged; 400k events, ``--quick`` 120k, ``--tiny`` 4k) and ``movielens`` (MovieLens-100k in time order,
``streamrec.ingest.load_movielens``; all of it, ``--tiny`` the first 4k).

1. Admission. Per stream: admit-all (``store.admit_min_count = 0``) and ``admit_min_count`` in ``THRESHOLDS``
   (``--tiny``: the first) with ``store.unadmitted = "zero"`` (the default) and with ``"shared"``. Per run the
   progressive AUC and logloss (every event scored before it is trained on), the stored rows (ids over
   ``store.export_records()`` after a flush, the shared row included) and seconds. ``<stream>.thresholds[N]`` (zero mode) and
   ``<stream>.shared[N]`` = {auc, logloss, rows, rows_vs_admit_all, auc_cost}, auc_cost = admit-all AUC minus
   the threshold's AUC. ``recommended_admit_min_count`` = the largest threshold whose zero-mode auc_cost is
   <= ``AUC_BUDGET`` on both streams (2 when none is). At that threshold: ``<stream>.rows_vs_admit_all``,
   ``<stream>.auc_cost_admission`` (zero mode) and ``<stream>.auc_cost_shared`` (the shared row).
   ``<stream>.noise_floor`` = |AUC(admit-all, first mini-batch one event short) - AUC(admit-all)|: a change
   of batch boundaries alone, the scale below which an auc_cost is indistinguishable from noise.
2. Compressed rows (``serving.row_precision``). Synthetic stream, admit-all, the default embedding dim and a
   second model at ``model.embedding_dim = 32`` (keys under ``dim32.``): train on the first 80% of the
   events, write one full snapshot of every stored row per precision (fp32, fp16, int8), push each to a real
   in-process gRPC server on 127.0.0.1 and score the held-out 20% through ``ServingClient``.
   ``int8_served_auc_diff`` / ``fp16_served_auc_diff`` = |held-out AUC(fp32) - AUC(p)|;
   ``int8_max_score_diff`` = max |served int8 - served fp32| probability; ``int8_table_bytes_ratio`` /
   ``fp16_table_bytes_ratio`` = the served version's ``MemoryRows.nbytes()`` over fp32's (``serving.hot_rows``
   holds every row); ``int8_push_bytes_ratio`` / ``fp16_push_bytes_ratio`` = the snapshot directory's bytes
   (all files) over fp32's.
3. Row cap. Synthetic stream, admit-all: ``store.max_rows = cap_rows`` = 10% of the distinct ids of the largest
   table, ``evict_slack`` default, LFU and LRU, against no cap; ``store.evict()`` after every fed chunk, as
   the trainer service does after each window. ``auc_cost_cap_lfu`` / ``auc_cost_cap_lru`` = no-cap AUC minus
   capped; ``rows_cap_lfu``, ``rows_cap_lru``, ``rows_no_cap`` = stored rows at the end; ``evicted_lfu``,
   ``evicted_lru`` = ``store.stats()["evicted"]``.

Goals (``goals``: goal, key, value, status, ok, reason): ``synthetic.rows_vs_admit_all <= 0.5``,
``synthetic.auc_cost_admission <= 0.001``, ``int8_served_auc_diff <= 0.0005``, ``int8_table_bytes_ratio <= 0.3``,
``int8_push_bytes_ratio <= 0.35``. A goal missed is reported with status FAIL.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

STREAMS = ("synthetic", "movielens")
THRESHOLDS = (2, 3, 5)
AUC_BUDGET = 0.001  # the AUC an admission threshold may cost on each stream to be the recommended default
BIG_IDS = 10_000_000  # ids of the synthetic user and item tables
SIZES = {"tiny": 4_000, "quick": 120_000, "full": 400_000}  # synthetic events (movielens: all, tiny 4k)
CHUNK = 4096  # events per ``core.feed``; the cap's sweep runs after each
PRECISIONS = ("fp32", "fp16", "int8")
GOALS = (("synthetic.rows_vs_admit_all", "<=", 0.5), ("synthetic.auc_cost_admission", "<=", 0.001),
         ("int8_served_auc_diff", "<=", 0.0005), ("int8_table_bytes_ratio", "<=", 0.3),
         ("int8_push_bytes_ratio", "<=", 0.35))


def _config(stream: str, over: dict):
    """The stream's config (bench quality's) with the hot tier off and ``over`` applied; the synthetic user and
    item tables at ``BIG_IDS`` ids."""
    from .bench_quality import _config as quality_config

    cfg = quality_config(stream, {"hot.budget_rows": 0, **over})
    if stream == "synthetic":
        for f in cfg.generator.fields:
            if f.name in ("user", "item"):
                f.cardinality = BIG_IDS
    return cfg


def _events(stream: str, cfg, n: int):
    from .bench_quality import _events as quality_events

    return quality_events(stream, cfg, n)[0]


def _stored_rows(store) -> int:
    """Rows the store holds over every tier (the hot tier is off: all of them are in the cold tier)."""
    store.flush()
    return sum(len(ids) for _, ids, _ in store.export_records()) + int(store.stats().get("hot_rows", 0))


def _train(cfg, events, path: Path, shift: int = 0, evict: bool = False, keep: bool = False):
    """Train a fresh ``TrainerCore`` on ``events`` (a first mini-batch ``shift`` events short when asked); the
    run's figures, and with ``keep`` the open ``(core, store)`` too."""
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.trainer import TrainerCore

    t0 = time.perf_counter()
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(path))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    start = 0
    if shift:
        start = cfg.trainer.batch_size - shift
        core.feed(events.take(np.arange(start)), flush=True)
    for s in range(start, len(events), CHUNK):
        core.feed(events.take(np.arange(s, min(len(events), s + CHUNK))))
        if evict:
            store.evict()
    core.flush()
    if evict:
        store.evict()
    out = {"auc": float(core.metrics.auc), "logloss": float(core.metrics.logloss), "rows": _stored_rows(store),
           "evicted": int(store.stats()["evicted"]), "seconds": round(time.perf_counter() - t0, 2)}
    if keep:
        return out, core, store
    store.close()
    return out


def admission(stream: str, n: int, tmp: Path, seed: int, thresholds: tuple[int, ...] = THRESHOLDS) -> dict:
    """Admit-all, every threshold of ``thresholds`` in zero mode (the default) and with the shared row, and the
    noise floor on ``stream``."""
    cfg = _config(stream, {"model.seed": seed})
    events = _events(stream, cfg, n)
    print(f"{stream}: {len(events):,} events, model seed {seed}", flush=True)

    def one(label: str, over: dict, **kw) -> dict:
        c = _config(stream, {"model.seed": seed, **over})
        for f, g in zip(c.model.fields, cfg.model.fields):
            f.expected_ids = g.expected_ids
        r = _train(c, events, tmp / f"{stream}-{label}", **kw)
        print(f"  {label:<14} AUC {r['auc']:.5f}  logloss {r['logloss']:.5f}  rows {r['rows']:>9,}  "
              f"{r['seconds']:6.1f} s", flush=True)
        return r

    base = one("admit-all", {"store.admit_min_count": 0})
    shifted = one("admit-all-1", {"store.admit_min_count": 0}, shift=1)
    out = {"events": len(events), "auc_admit_all": base["auc"], "logloss_admit_all": base["logloss"],
           "rows_admit_all": base["rows"], "seconds_admit_all": base["seconds"],
           "noise_floor": abs(shifted["auc"] - base["auc"]), "thresholds": {}, "shared": {}}
    for mode in ("zero", "shared"):
        for k in thresholds:
            r = one(f"min{k}-{mode}", {"store.admit_min_count": k, "store.unadmitted": mode})
            out["thresholds" if mode == "zero" else "shared"][str(k)] = {
                "auc": r["auc"], "logloss": r["logloss"], "rows": r["rows"], "seconds": r["seconds"],
                "rows_vs_admit_all": r["rows"] / max(1, base["rows"]), "auc_cost": base["auc"] - r["auc"]}
    return out


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def compressed(n: int, tmp: Path, seed: int, dim: int | None) -> dict:
    """Train on the first 80% of the synthetic events; one full snapshot per precision served by a real gRPC
    server, scored on the last 20%."""
    from streamrec.foundation import roc_auc
    from streamrec.serving import ServerSettings, ServingClient, SnapshotPusher, batch_to_request, serve
    from streamrec.snapshot import empty_evidence, write_snapshot

    over = {"model.seed": seed, "store.admit_min_count": 0}
    if dim:
        over.update({"model.embedding_dim": dim, "model.bottom_mlp": [32, dim]})
    cfg = _config("synthetic", over)
    events = _events("synthetic", cfg, n)
    cut = int(len(events) * 0.8)
    train, held = events.take(np.arange(cut)), events.take(np.arange(cut, len(events)))
    label = f"dim {cfg.model.embedding_dim}"
    r, core, store = _train(cfg, train, tmp / f"compress-{cfg.model.embedding_dim}", keep=True)
    try:
        rows = list(store.changed_rows())
    finally:
        store.close()
    n_rows = sum(len(b) for b in rows)
    print(f"  {label}: trained on {cut:,} events (AUC {r['auc']:.5f}), {n_rows:,} rows; serving the last "
          f"{len(held):,}", flush=True)
    scfg = _config("synthetic", {**over, "serving.data_dir": str(tmp / f"serving-{cfg.model.embedding_dim}"),
                                 "serving.push_token": "bench", "serving.hot_rows": max(100_000, 2 * n_rows)})
    snaps, scores, table_bytes = {}, {}, {}
    srv = serve(ServerSettings(scfg.serving, scfg.store, scfg.ingest.dense_abs_max), device="cpu", port=0)
    try:
        with SnapshotPusher(srv.target, token="bench") as pusher, ServingClient(srv.target, timeout=60) as client:
            for v, p in enumerate(PRECISIONS, start=1):
                snaps[p] = write_snapshot(
                    tmp / f"snap-{cfg.model.embedding_dim}-{p}", version=v, parent_version=None, kind="full",
                    dense_state=core.model.state_dict(), rows=rows, kafka_offsets={}, metrics={"auc": r["auc"]},
                    config_hash=cfg.model_hash(), newest_event_ms=int(train.ts.max()),
                    model_config=cfg.to_dict()["model"], store_config={"init_scale": cfg.store.init_scale},
                    evidence=empty_evidence(), row_precision=p)
                res = pusher.push(snaps[p])
                if not res.ok:
                    raise RuntimeError(f"serving refused the {p} snapshot: {res}")
                parts = []
                for s in range(0, len(held), scfg.serving.max_batch):
                    got, version = client.predict_request(
                        batch_to_request(held.take(np.arange(s, min(len(held), s + scfg.serving.max_batch)))))
                    if version != v:
                        raise RuntimeError(f"served version {version}, pushed {v} ({p})")
                    parts.append(got)
                scores[p] = np.concatenate(parts).astype(np.float64)
                memory = srv.service.current.memory
                if sum(len(i) for i in memory.ids.values()) != n_rows:
                    raise RuntimeError(f"serving holds {sum(len(i) for i in memory.ids.values())} of {n_rows} rows")
                table_bytes[p] = memory.nbytes()
    finally:
        srv.stop(0.5)
    labels = held.labels
    auc = {p: float(roc_auc(labels, scores[p])) for p in PRECISIONS}
    out = {"dim": cfg.model.embedding_dim, "rows": n_rows, "train_events": cut, "held_out_events": len(held),
           **{f"{p}_served_auc": auc[p] for p in PRECISIONS},
           **{f"{p}_table_bytes": table_bytes[p] for p in PRECISIONS},
           **{f"{p}_push_bytes": _dir_bytes(snaps[p]) for p in PRECISIONS}}
    for p in ("fp16", "int8"):
        out[f"{p}_served_auc_diff"] = abs(auc["fp32"] - auc[p])
        out[f"{p}_max_score_diff"] = float(np.max(np.abs(scores[p] - scores["fp32"])))
        out[f"{p}_table_bytes_ratio"] = table_bytes[p] / table_bytes["fp32"]
        out[f"{p}_push_bytes_ratio"] = out[f"{p}_push_bytes"] / out["fp32_push_bytes"]
    print(f"  {label}: held-out AUC " + "  ".join(f"{p} {auc[p]:.5f}" for p in PRECISIONS)
          + f"; table bytes int8/fp32 {out['int8_table_bytes_ratio']:.3f}, fp16/fp32 "
          f"{out['fp16_table_bytes_ratio']:.3f}; push bytes int8/fp32 {out['int8_push_bytes_ratio']:.3f}, "
          f"fp16/fp32 {out['fp16_push_bytes_ratio']:.3f}; max |int8 - fp32| score {out['int8_max_score_diff']:.5f}",
          flush=True)
    return out


def cap(n: int, tmp: Path, seed: int) -> dict:
    """The synthetic stream, admit-all, with no cap and with ``store.max_rows`` = 10% of the largest table's
    distinct ids under LFU and LRU."""
    cfg = _config("synthetic", {"model.seed": seed, "store.admit_min_count": 0})
    events = _events("synthetic", cfg, n)
    distinct: dict[str, set] = {}
    for f in cfg.model.fields:
        distinct.setdefault(f.table or f.name, set()).update(np.unique(events.sparse[f.name].values).tolist())
    cap_rows = max(1, max(len(s) for s in distinct.values()) // 10)
    print(f"cap: {len(events):,} synthetic events, store.max_rows = {cap_rows:,} (10% of the largest table's "
          f"distinct ids)", flush=True)
    out: dict = {"cap_rows": cap_rows}
    for label, over in (("no_cap", {}), ("lfu", {"store.max_rows": cap_rows, "store.eviction": "lfu"}),
                        ("lru", {"store.max_rows": cap_rows, "store.eviction": "lru"})):
        c = _config("synthetic", {"model.seed": seed, "store.admit_min_count": 0, **over})
        for f, g in zip(c.model.fields, cfg.model.fields):
            f.expected_ids = g.expected_ids
        r = _train(c, events, tmp / f"cap-{label}", evict=bool(over))
        print(f"  {label:<7} AUC {r['auc']:.5f}  logloss {r['logloss']:.5f}  rows {r['rows']:>9,}  evicted "
              f"{r['evicted']:>9,}  {r['seconds']:6.1f} s", flush=True)
        key = "no_cap" if label == "no_cap" else f"cap_{label}"
        out[f"auc_{key}"], out[f"rows_{key}"] = r["auc"], r["rows"]
        if label != "no_cap":
            out[f"evicted_{label}"] = r["evicted"]
    for label in ("lfu", "lru"):
        out[f"auc_cost_cap_{label}"] = out["auc_no_cap"] - out[f"auc_cap_{label}"]
    return out


def _lookup(r: dict, key: str):
    v = r
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def goals(r: dict) -> list[dict]:
    def one(key: str, op: str, bound: float) -> dict:
        goal = f"{key} {op} {bound:g}"
        v = _lookup(r, key)
        if v is None or v != v:
            return {"goal": goal, "key": key, "value": None, "status": "FAIL", "ok": False, "reason": "not measured"}
        ok = bool(v <= bound)
        return {"goal": goal, "key": key, "value": v, "status": "PASS" if ok else "FAIL", "ok": ok, "reason": ""}

    return [one(k, op, b) for k, op, b in GOALS]


def run(size: str, seed: int = 0, threads: int = 1) -> dict:
    import torch

    torch.set_num_threads(threads)
    n = SIZES[size]
    n_movielens = 4_000 if size == "tiny" else 10**9
    t0 = time.perf_counter()
    r: dict = {"size": size, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as d:
        tmp = Path(d)
        print("admission (progressive AUC; rows = stored rows at the end)", flush=True)
        thresholds = THRESHOLDS[:1] if size == "tiny" else THRESHOLDS  # a smoke run: each admission mode once
        for stream in STREAMS:
            r[stream] = admission(stream, n if stream == "synthetic" else n_movielens, tmp, seed, thresholds)
        chosen = 2
        for k in thresholds:
            if all(r[s]["thresholds"][str(k)]["auc_cost"] <= AUC_BUDGET for s in STREAMS):
                chosen = k
        r["recommended_admit_min_count"] = chosen
        for s in STREAMS:
            t = r[s]["thresholds"][str(chosen)]
            r[s]["rows_vs_admit_all"] = t["rows_vs_admit_all"]
            r[s]["auc_cost_admission"] = t["auc_cost"]
            r[s]["auc_cost_shared"] = r[s]["shared"][str(chosen)]["auc_cost"]
        print("compressed rows (held-out AUC through a real gRPC server)", flush=True)
        c = compressed(n, tmp, seed, None)
        c32 = compressed(n, tmp, seed, 32)
        keys = ("int8_served_auc_diff", "fp16_served_auc_diff", "int8_table_bytes_ratio", "fp16_table_bytes_ratio",
                "int8_push_bytes_ratio", "fp16_push_bytes_ratio", "int8_max_score_diff")
        r.update({k: c[k] for k in keys})
        r["dim32"] = {k: c32[k] for k in keys}
        r["compressed"] = {"default": c, "dim32": c32}
        r.update(cap(n, tmp, seed))
    r["seconds"] = round(time.perf_counter() - t0, 1)
    return r


def _report(r: dict, gs: list[dict]) -> None:
    print(f"\nadmission, recommended admit_min_count = {r['recommended_admit_min_count']} (largest threshold costing "
          f"<= {AUC_BUDGET:g} AUC on both streams)")
    for s in STREAMS:
        x = r[s]
        print(f"  {s:<10} admit-all AUC {x['auc_admit_all']:.5f}, {x['rows_admit_all']:,} rows; noise floor "
              f"{x['noise_floor']:.5f}")
        for k, t in x["thresholds"].items():
            z = x["shared"][k]
            print(f"    min {k}: rows {t['rows_vs_admit_all']:.3f}x  AUC cost zero {t['auc_cost']:+.5f}  "
                  f"shared {z['auc_cost']:+.5f}")
    print(f"compressed rows: served AUC diff int8 {r['int8_served_auc_diff']:.5f} fp16 {r['fp16_served_auc_diff']:.5f}"
          f" (dim 32: int8 {r['dim32']['int8_served_auc_diff']:.5f}); table bytes int8 "
          f"{r['int8_table_bytes_ratio']:.3f}x fp16 {r['fp16_table_bytes_ratio']:.3f}x (dim 32: int8 "
          f"{r['dim32']['int8_table_bytes_ratio']:.3f}x); push bytes int8 {r['int8_push_bytes_ratio']:.3f}x fp16 "
          f"{r['fp16_push_bytes_ratio']:.3f}x (dim 32: int8 {r['dim32']['int8_push_bytes_ratio']:.3f}x)")
    print(f"cap {r['cap_rows']:,} rows: AUC cost LFU {r['auc_cost_cap_lfu']:+.5f} LRU {r['auc_cost_cap_lru']:+.5f}; "
          f"rows no cap {r['rows_no_cap']:,} LFU {r['rows_cap_lfu']:,} LRU {r['rows_cap_lru']:,}")
    for g in gs:
        shown = "null" if g["value"] is None else f"{g['value']:.5f}"
        print(f"  goal {g['status']}: {g['goal']} ({g['key']} = {shown}){'; ' + g['reason'] if g['reason'] else ''}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="120k synthetic events, all of MovieLens-100k")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke run (4k events per stream): checks the bench works, its figures mean little")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--seed", type=int, default=0, help="model seed (the same for every run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    a = p.parse_args(argv or [])
    size = "tiny" if a.tiny else "quick" if a.quick else "full"
    r = run(size, a.seed, a.threads)
    gs = goals(r)
    r["goals"] = gs
    r["goals_met"] = all(g["ok"] for g in gs)
    _report(r, gs)
    results = Path(__file__).resolve().parent / "results"
    if size != "tiny" and results.is_dir():  # a smoke run's figures mean little: not kept
        (results / f"tables-{size}.json").write_text(json.dumps(r, indent=1) + "\n")
    if a.json:
        print(json.dumps(r))
    return 0
