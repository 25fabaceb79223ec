"""``streamrec bench train``: training throughput, AUC and peak memory of three set-ups
on the same skewed Criteo-like stream (26 sparse fields, 10M ids in all, dim 16,
13 dense features, DLRM 13-512-256-64-16 / 512-256-1):

  memory: plain in-memory PyTorch DLRM, every row in one table per field, row-wise
          Adagrad on the touched rows only (the baseline)
  cold:   the trainer with every row in the store: no hot tier and no host cache,
          so every lookup and update goes to RocksDB (the floor)
  fae:    the trainer with FAE hot/cold mini-batches, hot tier <= 5% of the rows,
          host cache of cold rows as the default config has it

``--model NAME`` (or ``all``) runs the fae set-up once per architecture instead (dlrm always), on
the same stream, and reports each one's events/s against the DLRM's (``vs_dlrm``).

Each set-up runs in its own subprocess so its peak RSS is its own, with the same
torch thread count (``--threads``). Kafka is left out of all three (same
pre-generated events in memory), so the numbers compare training paths only.
Events/s counts the training loop after a warm-up window; data generation and
model/vocabulary set-up are excluded and reported separately. AUC is measured on the
same held-out slice (the two windows after the trained events) for every set-up;
progressive AUC is reported too, but FAE reorders events inside a window, so some of
its events are scored after later ones trained, which flatters its progressive AUC.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from .common import add_device_arg, bench_device

FIELDS = 26
MODELS = ("dlrm", "dcn_v2", "deepfm", "mlp")  # model.architecture's built-ins
TOTAL_IDS = 10_000_000
# Criteo Kaggle's 26 categorical cardinalities, scaled so they sum to --ids: a few huge
# fields and many tiny ones, which is what makes whole samples hot (FAE's premise)
CRITEO = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
          5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def bench_config(root: str, ids: int, batch: int, setup: str, extra: dict | None = None, device: str = "cpu"):
    from streamrec.app.config import load_config

    scale = ids / sum(CRITEO)
    fields = [{"name": f"c{i:02d}", "cardinality": max(2, round(c * scale)), "zipf": 1.2}
              for i, c in enumerate(CRITEO)]
    over = {
        "model.fields": [{"name": f["name"]} for f in fields], "generator.fields": fields, "model.dense_dim": 13, "model.embedding_dim": 16,
        "model.bottom_mlp": [512, 256, 64, 16], "model.top_mlp": [512, 256],
        "store.path": os.path.join(root, "store"), "store.shards": 4,
        "trainer.batch_size": batch, "trainer.window_batches": 4, "trainer.device": device,
        "hot.budget_rows": int(0.05 * ids),
        **(extra or {}),
    }
    if setup == "cold":  # the RocksDB floor: nothing held above it
        over.update({"store.host_cache_rows": 0, "hot.budget_rows": 0})
    return load_config(None, over, env={})


def rss_mb() -> float:
    """Current resident set size (Linux /proc), MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class LazyVocab:
    """The baseline's vocabulary (every id of every field), made one field at a time so the
    set-up does not hold all fields' id lists at once."""

    def __init__(self, cfg):
        self.card = {f.name: cfg.generator.field(f.name).cardinality for f in cfg.model.fields}

    def __getitem__(self, field: str):
        from streamrec.ingest.synthetic import rank_to_id

        return rank_to_id(field, np.arange(self.card[field]))


def windows_of(stream, events: int, window: int, dense_dim: int, fields):
    """Consecutive windows of ``window`` events, generated on demand (the benchmark holds one
    window at a time, like the trainer polling Kafka, so RSS is the training path's)."""
    from streamrec.ingest import EventBatch

    buf, n = [], 0
    for b in stream.batches(events):
        buf.append(b)
        n += len(b)
        while n >= window:
            allb = EventBatch.concat(buf, dense_dim, fields)
            yield allb.take(np.arange(window))
            rest = allb.take(np.arange(window, n))
            buf, n = ([rest] if len(rest) else []), len(rest)
    if n:
        yield EventBatch.concat(buf, dense_dim, fields)


def run_one(setup: str, events: int, ids: int, batch: int, sample: int, threads: int,
            profile: str | None = None, sets: dict | None = None, early_scores: bool = True,
            device: str = "cpu") -> dict:
    import torch

    from streamrec.ingest import SyntheticStream

    from .common import sync

    torch.set_num_threads(threads)
    dev = torch.device(device)
    root = tempfile.mkdtemp(prefix=f"bench-train-{setup}-")
    cfg = bench_config(root, ids, batch, setup, sets, device=str(dev))
    fields = cfg.model.field_names
    window = batch * cfg.trainer.window_batches
    held_n = 2 * window  # the events right after the trained ones: held-out AUC, the same slice for every set-up
    stream = windows_of(SyntheticStream(cfg), events + held_n, window, cfg.model.dense_dim, fields)
    t0 = time.perf_counter()
    first = [next(stream) for _ in range(-(-sample // window))]  # FAE's sample; the rest comes lazily
    gen_s = time.perf_counter() - t0
    rss_data = rss_mb()
    t0 = time.perf_counter()
    extra = {}
    if setup == "memory":
        from streamrec.trainer.metrics import StreamingMetrics
        from streamrec.trainer.reference import MemoryDLRM

        model = MemoryDLRM(cfg.model, cfg.trainer, cfg.store, LazyVocab(cfg), dev)
        metrics = StreamingMetrics(cfg.trainer.metrics_window)
        extra["rows"] = sum(len(v) for v in model.ids.values())
        extra["table_mb"] = model.nbytes() / 2**20

        def train(w):
            for s in range(0, len(w), batch):
                mb = w.take(np.arange(s, min(len(w), s + batch)))
                metrics.update(mb.labels, model.train_batch(mb))
        predict = model.predict
    else:
        from streamrec.embedding_store import EmbeddingStore
        from streamrec.trainer.core import TrainerCore
        from streamrec.foundation import hot_budget, hot_budget_rows
        from streamrec.trainer.hotset import SampleHotSource

        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), dev)
        core = TrainerCore(cfg.model, cfg.trainer, store, dev, store_cfg=cfg.store, join=cfg.join)
        core.batcher.early_scores = early_scores  # False: a diagnostic (what honest early scores cost)
        metrics = core.metrics
        extra["host_cache_rows"] = cfg.store.host_cache_rows
        if setup == "fae":
            # FAE: hot rows from a sample of the stream (the first `sample` events), not a full pass
            src = SampleHotSource(fields, hot_budget_rows(cfg.hot, cfg.model), sample_events=sample)
            for w in first:
                src.observe(w)
            upd = src.poll()
            core.apply_hot_set(upd.version, upd.tables)
            extra["hot_rows"] = core.hot_rows
            extra["hot_coverage_sample"] = upd.coverage

        def train(w):
            core.feed(w)  # as the service does: mini-batches form across windows (trainer/batching.py)
        predict = core.predict
    setup_s = time.perf_counter() - t0
    rss_setup = rss_mb()
    warm = first.pop(0)
    train(warm)  # warm-up (allocations, first RocksDB files), counted in AUC but not in time
    sync(dev)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    dt = cpu = 0.0
    timed = 0

    def timed_windows():
        yield from first
        seen = len(warm) + sum(len(w) for w in first)
        for w in stream:
            if seen >= events:
                held.append(w)
                continue
            seen += len(w)
            yield w

    held: list = []

    for w in timed_windows():  # generating a window is not timed: the real trainer polls it from Kafka
        if prof is not None:
            prof.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        train(w)
        sync(dev)  # the window's queued device work counts in its time
        dt += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if prof is not None:
            prof.disable()
        timed += len(w)
    if setup != "memory":  # the stream's tail: events still waiting for a full mini-batch
        c0, t0 = time.process_time(), time.perf_counter()
        core.flush()
        sync(dev)
        dt += time.perf_counter() - t0
        cpu += time.process_time() - c0
    if prof is not None:
        prof.dump_stats(profile)
    from streamrec.foundation import EventBatch, roc_auc

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # training's peak, before evaluation
    hb = EventBatch.concat(held, cfg.model.dense_dim, fields)
    scores = [predict(hb.take(np.arange(s, min(len(hb), s + batch)))) for s in range(0, len(hb), batch)]
    held_auc = roc_auc(hb.labels, np.concatenate(scores)[:, 0]) if len(hb) else float("nan")  # the first task
    out = {"setup": setup, "events": events, "timed_events": timed, "events_per_s": timed / dt, "train_s": dt,
           "cpu_s": cpu, "setup_s": setup_s, "gen_s": gen_s, "threads": threads, "device": str(dev), "auc": held_auc,
           "held_out_events": len(hb), "progressive_auc": metrics.auc,
           "window_auc": metrics.window_auc(), "logloss": metrics.logloss,
           "rss_after_data_mb": rss_data, "rss_after_setup_mb": rss_setup,
           "peak_rss_mb": peak, **extra}
    if setup != "memory":
        out["hot_fraction"] = core.hot_events / core.events
        out["store"] = {k: v for k, v in store.stats().items() if isinstance(v, (int, float))}
        store.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench train", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer events and ids (under a minute)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    p.add_argument("--events", type=int, help="events per set-up")
    p.add_argument("--ids", type=int, help=f"ids over all fields (default {TOTAL_IDS:,})")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads in every set-up (default 1: the trainer's prefetch thread "
                        "needs the other core of a small box, and oversubscribed OpenMP threads stall)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every set-up (cold keeps no hot tier and no host cache)")
    p.add_argument("--setups", default="memory,cold,fae", help=argparse.SUPPRESS)
    p.add_argument("--run-one", choices=["memory", "cold", "fae"], help=argparse.SUPPRESS)
    p.add_argument("--profile", help=argparse.SUPPRESS)  # with --run-one: cProfile stats of the timed loop
    p.add_argument("--without-early-scores", action="store_true",
                   help="diagnostic: FAE and cold without progressive validation's early scores (their "
                        "progressive AUC then peeks at later events; the held-out AUC is unchanged)")
    p.add_argument("--model", choices=[*MODELS, "all"],
                   help="instead of the three set-ups: the fae set-up with this model.architecture (all: every "
                        "built-in) and with dlrm, in one run: each one's events/s and its ratio to the DLRM's")
    p.add_argument("--host-ceiling", action="store_true",
                   help="instead of the three set-ups: the trainer's pipeline from an Arrow backlog with a model "
                        "of negligible arithmetic, host microseconds per event by stage (benchmarks/host_ceiling.py)")
    p.add_argument("--device-busy", action="store_true",
                   help="instead of the three set-ups: the fae set-up under torch.profiler, the share of the wall "
                        "time the device is busy (benchmarks/device_busy.py)")
    add_device_arg(p)
    args = p.parse_args(argv)
    # this process hands the device's name on to the set-ups' processes, which resolve it: "cpu" needs no torch here
    device = "cpu" if args.device == "cpu" else str(bench_device(args.device, p))
    # quick: 1M ids, 12 windows of 8k events (1 warm-up + 11 timed, a few seconds per set-up)
    events = args.events or (4_096 if args.tiny else 98_304 if args.quick else 204_800)
    ids = args.ids or (20_000 if args.tiny else 1_000_000 if args.quick else TOTAL_IDS)
    if args.tiny:
        args.batch = 256
    sample = min(50_000, events // 2)
    sets = {}
    for kv in args.set:
        k, sep, v = kv.partition("=")
        if not sep:
            p.error(f"--set wants KEY=VALUE, got {kv!r}")
        sets[k] = json.loads(v) if v[:1].isdigit() or v[:1] in "[{-" or v in ("true", "false") else v
    if args.host_ceiling or args.device_busy:  # one pipeline measurement instead of the three set-ups
        from . import device_busy, host_ceiling

        mode = host_ceiling if args.host_ceiling else device_busy
        r = mode.run(events, ids, args.batch, args.threads, device)
        print(mode.report(r), flush=True)
        if args.json:
            print(json.dumps(r))
        return 0
    if args.run_one:
        print(json.dumps(run_one(args.run_one, events, ids, args.batch, sample, args.threads, args.profile, sets,
                                 early_scores=not args.without_early_scores, device=device)))
        return 0
    def run_setup(setup: str, extra_sets: list[str]) -> dict | None:
        cmd = [sys.executable, "-m", "streamrec.benchmarks.bench_train", "--run-one", setup, "--events", str(events),
               "--ids", str(ids), "--batch", str(args.batch), "--threads", str(args.threads), "--device", device]
        cmd += [a for kv in [*args.set, *extra_sets] for a in ("--set", kv)]
        cmd += ["--without-early-scores"] if args.without_early_scores else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return None
        return json.loads(proc.stdout.strip().splitlines()[-1])

    if args.model:
        return _compare_models(args, run_setup, events, ids, device)
    res = {}
    for setup in args.setups.split(","):
        r = run_setup(setup, [])
        if r is None:
            return 1
        res[setup] = r
        print(f"{setup:>6}: {r['events_per_s']:>9,.0f} events/s  held-out auc {r['auc']:.4f} "
              f"(progressive {r['progressive_auc']:.4f})  "
              f"peak RSS {r['peak_rss_mb']:,.0f} MB (after set-up {r['rss_after_setup_mb']:,.0f})  "
              f"(setup {r['setup_s']:.1f}s, train {r['train_s']:.1f}s, cpu {r['cpu_s']:.1f}s"
              + (f", hot fraction {r['hot_fraction']:.1%}" if "hot_fraction" in r else "") + ")", flush=True)
    if set(res) != {"memory", "cold", "fae"}:  # a subset of set-ups: no ratios, each set-up's own figures
        if args.json:
            print(json.dumps({"device": device, "setups": res}))
        return 0
    m, c, f = res["memory"], res["cold"], res["fae"]
    summary = {
        "fae_events_per_s": f["events_per_s"], "memory_events_per_s": m["events_per_s"],
        "cold_events_per_s": c["events_per_s"],
        "fae_vs_memory": f["events_per_s"] / m["events_per_s"], "fae_vs_cold": f["events_per_s"] / c["events_per_s"],
        "auc_fae": f["auc"], "auc_memory": m["auc"], "auc_cold": c["auc"],  # held-out, after the same events
        "progressive_auc": {k: v["progressive_auc"] for k, v in res.items()},
        "fae_rss_vs_memory": f["peak_rss_mb"] / m["peak_rss_mb"],
        "events": events, "ids": ids, "batch": args.batch, "threads": args.threads, "device": device,
        "hot_fraction": f.get("hot_fraction"),
        "peak_rss_mb": {k: v["peak_rss_mb"] for k, v in res.items()},
        "early_scores": not args.without_early_scores,  # False: a diagnostic run, not the trainer as shipped
    }
    print(f"ratios: fae/memory {summary['fae_vs_memory']:.2f}x (goal >= 0.7), fae/cold {summary['fae_vs_cold']:.2f}x "
          f"(goal >= 3), |auc fae - memory| {abs(f['auc'] - m['auc']):.4f} (goal <= 0.002), "
          f"fae RSS / memory RSS {summary['fae_rss_vs_memory']:.2f} (goal <= 0.30)"
          + ("; WITHOUT early scores (diagnostic: the progressive AUCs peek)" if args.without_early_scores else ""))
    if args.json:
        print(json.dumps(summary))
    return 0


def _compare_models(args, run_setup, events: int, ids: int, device: str) -> int:
    """The fae set-up per architecture, on the same stream: events/s and the ratio to dlrm's (``vs_dlrm``)."""
    names = ["dlrm", *(m for m in MODELS if m != "dlrm")] if args.model == "all" else list(dict.fromkeys(["dlrm", args.model]))
    res = {}
    for name in names:
        r = run_setup("fae", [f"model.architecture={name}"])
        if r is None:
            return 1
        res[name] = r
        print(f"{name:>7}: {r['events_per_s']:>9,.0f} events/s  held-out auc {r['auc']:.4f}  "
              f"(train {r['train_s']:.1f}s, cpu {r['cpu_s']:.1f}s)", flush=True)
    base = res["dlrm"]["events_per_s"]
    summary = {"model": args.model, "events_per_s": {k: v["events_per_s"] for k, v in res.items()},
               "vs_dlrm": {k: v["events_per_s"] / base for k, v in res.items()},
               "auc": {k: v["auc"] for k, v in res.items()},
               "events": events, "ids": ids, "batch": args.batch, "threads": args.threads, "device": device}
    print("events/s vs dlrm: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary["vs_dlrm"].items()))
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
