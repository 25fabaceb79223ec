"""``streamrec bench quality``: does the online trainer learn as well as an independent offline
DLRM, and does FAE cost AUC? On the synthetic stream (the default model and generator config),
the same events in the same order, means over model seeds:

  trainer:   TrainerCore (tiered store, event-driven batches), hot tier off
  reference: ``benchmarks/plain_dlrm.py`` (plain PyTorch, nn.EmbeddingBag, written without the
             trainer's code), same batch size, learning rates and init rule
  fae:       TrainerCore with an FAE hot set (the sampled top ``hot.budget_rows`` rows)
  plain:     = trainer (the same stream with the hot tier off)

All AUCs and loglosses are progressive (every event scored before it is trained on). Kafka is
left out (``streamrec eval FILE`` runs the same comparison through a broker). The noise floor is
measured too: the trainer again with its first mini-batch one event short, which moves every
batch boundary and nothing else.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _stream(cfg, n: int):
    from streamrec.foundation import EventBatch
    from streamrec.ingest import SyntheticStream

    s = SyntheticStream(cfg)
    return s, EventBatch.concat(list(s.batches(n)), cfg.model.dense_dim, cfg.model.field_names)


def _trainer(cfg, events, path: Path, hot=None, shift: int = 0):
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.trainer import TrainerCore

    store = EmbeddingStore.from_config(cfg, "cpu", path=str(path))
    core = TrainerCore(cfg, store, torch.device("cpu"))
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


def run(events_n: int, seeds: list[int], threads: int, batch: int = 0) -> dict:
    import torch

    from .plain_dlrm import reference_progressive
    from streamrec.foundation import load_config
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
            cfg = load_config(None, {"model.seed": seed, "trainer.device": "cpu", **over}, env={})
            gen, events = _stream(cfg, events_n)
            bayes = gen.bayes_auc(events_n)
            for f in cfg.model.fields:  # DLRM's init rule from the table sizes, for both models
                f.expected_ids = max(1, int(len(np.unique(events.sparse[f.name].values))))
            src = SampleHotSource(cfg.model.field_names, budget=cfg.hot.budget_rows,
                                  sample_events=min(len(events), max(1, events_n // 5)))
            src.observe(events.take(np.arange(min(len(events), max(1, events_n // 5)))))
            hot = src.poll().tables
            plain = _trainer(cfg, events, Path(tmp) / f"plain-{seed}")
            shifted = _trainer(cfg, events, Path(tmp) / f"shift-{seed}", shift=1)
            fae = _trainer(cfg, events, Path(tmp) / f"fae-{seed}", hot=hot)
            ref = reference_progressive(cfg, events)
            for k, v in (("auc_trainer", plain.metrics.auc), ("auc_reference", ref["auc"]),
                         ("auc_fae", fae.metrics.auc), ("auc_shifted", shifted.metrics.auc),
                         ("logloss_trainer", plain.metrics.logloss), ("logloss_reference", ref["logloss"]),
                         ("logloss_fae", fae.metrics.logloss), ("hot_fraction", fae.hot_events / max(1, fae.events))):
                rows[k].append(float(v))
            print(f"seed {seed}: trainer {plain.metrics.auc:.5f}  reference {ref['auc']:.5f}  fae {fae.metrics.auc:.5f}"
                  f"  shifted {shifted.metrics.auc:.5f}  (hot fraction {rows['hot_fraction'][-1]:.3f})", flush=True)
    out = {k: float(np.mean(v)) for k, v in rows.items()}
    out["auc_plain"] = out["auc_trainer"]
    out["per_seed"] = rows
    out.update(stream="synthetic", events=events_n, seeds=seeds, bayes_auc=bayes, batch_size=cfg.trainer.batch_size,
               noise_floor=float(np.mean(np.abs(np.subtract(rows["auc_shifted"], rows["auc_trainer"])))),
               seconds=round(time.perf_counter() - t0, 1))
    return out


SWEEP = [{"trainer.batch_size": 1024}, {"trainer.batch_size": 512}, {"trainer.batch_size": 256},
         {"trainer.batch_size": 128}, {"trainer.batch_size": 256, "trainer.dense_lr": 3e-3},
         {"trainer.batch_size": 256, "store.adagrad_lr": 0.1}, {"trainer.batch_size": 256, "store.adagrad_lr": 0.02}]


def sweep(events_n: int, threads: int) -> list[dict]:
    """The trainer alone (hot tier off, model seed 0) over the settings the defaults were chosen from."""
    import torch

    from streamrec.foundation import load_config

    torch.set_num_threads(threads)
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-quality-sweep-") as tmp:
        for i, over in enumerate(SWEEP):
            cfg = load_config(None, {"trainer.device": "cpu", **over}, env={})
            _, events = _stream(cfg, events_n)
            for f in cfg.model.fields:
                f.expected_ids = max(1, int(len(np.unique(events.sparse[f.name].values))))
            core = _trainer(cfg, events, Path(tmp) / str(i))
            out.append({**over, "auc": core.metrics.auc, "logloss": core.metrics.logloss})
            print(f"  {over}: progressive AUC {core.metrics.auc:.5f}  logloss {core.metrics.logloss:.5f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="30k events, one seed (a smoke run: noisy)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--events", type=int, default=0, help="events per stream (default 100k, quick 30k)")
    p.add_argument("--seeds", type=int, default=0, help="model seeds averaged (default 3, quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--batch", type=int, default=0, help="trainer.batch_size of both models (default: the config's)")
    p.add_argument("--sweep", action="store_true", help="instead: the trainer over batch sizes and learning rates")
    a = p.parse_args(argv)
    n = a.events or (30_000 if a.quick else 100_000)
    if a.sweep:
        print(f"sweep on the synthetic stream, {n:,} events, model seed 0, hot tier off")
        rows = sweep(n, a.threads)
        if a.json:
            print(json.dumps({"stream": "synthetic", "events": n, "sweep": rows}))
        return 0
    seeds = list(range(a.seeds or (1 if a.quick else 3)))
    r = run(n, seeds, a.threads, a.batch)
    goals = [("auc_trainer >= auc_reference - 0.001", r["auc_trainer"] >= r["auc_reference"] - 0.001),
             ("abs(auc_fae - auc_plain) <= 0.001", abs(r["auc_fae"] - r["auc_plain"]) <= 0.001)]
    print(f"\nsynthetic stream, {n:,} events, mean of {len(seeds)} seed(s); Bayes AUC {r['bayes_auc']:.4f}")
    print(f"  progressive AUC  trainer {r['auc_trainer']:.5f}  reference {r['auc_reference']:.5f}  "
          f"(ratio {r['auc_trainer'] / r['auc_reference']:.4f})")
    print(f"  logloss          trainer {r['logloss_trainer']:.5f}  reference {r['logloss_reference']:.5f}")
    print(f"  FAE              {r['auc_fae']:.5f} vs plain {r['auc_plain']:.5f}: {r['auc_fae'] - r['auc_plain']:+.5f} "
          f"(hot fraction {r['hot_fraction']:.3f})")
    print(f"  noise floor      |AUC(first batch one event short) - AUC| = {r['noise_floor']:.5f}")
    for text, ok in goals:
        print(f"  goal {text}: {'met' if ok else 'NOT met'}")
    if a.json:
        print(json.dumps({**r, "goals": {t: ok for t, ok in goals}}))
    return 0
