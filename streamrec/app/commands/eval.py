"""``streamrec eval FILE``: progressive-validation parity on your own data.

The file is replayed through the real trainer (Kafka: the configured cluster or an
embedded broker, one partition so the trainer reads it in file order) and through
an independent plain-PyTorch implementation of the configured architecture
(``streamrec.model.references``: ``plain_dlrm`` for dlrm, ``rankers`` for the others)
in the same order; both progressive AUCs and loglosses are printed side by
side, then one JSON line. A model of several tasks is compared task by task: the trainer's
figures for each task (over the events carrying its label) against a one-task reference
trained on those events. A user's ``model.module``, or fields of different widths, have no
independent reference: the trainer's figures are printed alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from streamrec.app.config import Config
    from streamrec.model.references import ReferenceTraining

log = logging.getLogger(__name__)


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("eval", parents=[common], help="replay a data file through the trainer and an independent "
                       "reference of its architecture; print both progressive AUCs and loglosses (per task)")
    p.add_argument("file", help="events file (csv/tsv, jsonl, parquet, criteo, avazu; see `streamrec produce`)")
    p.add_argument("--layout", help="file layout (criteo, avazu, ...; default: from the file)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="use the first N events (0 = all)")
    p.add_argument("--seeds", type=int, default=3, metavar="K",
                   help="model seeds model.seed .. +K-1, means printed (default 3: one seed's AUC moves by "
                        "+-0.007 on 60k events, more on fewer)")
    p.set_defaults(func=cmd_eval)


def read_all(path: str, cfg, layout: str | None, limit: int):
    """The file's events as one EventBatch (the reference needs its vocabulary up front)."""
    from streamrec.foundation import EventBatch
    from streamrec.ingest import EventSchema, read_file

    parts, n = [], 0
    for b in read_file(path, EventSchema.from_sections(cfg.model, cfg.ingest), layout or "auto"):
        if limit and n + len(b) > limit:
            b = b.take(np.arange(limit - n))
        parts.append(b)
        n += len(b)
        if limit and n >= limit:
            break
    return EventBatch.concat(parts, cfg.model.dense_dim, cfg.model.field_names)


def trainer_progressive(cfg: Config, events, bootstrap: str, work: Path) -> dict:
    """Produce ``events`` into a fresh one-partition topic and train on it until its end."""
    from streamrec.ingest import EventProducer, EventSchema, ensure_topics, pipeline_topics
    from streamrec.trainer import TrainerService

    cfg = cfg.with_values(
        kafka={"events_topic": f"eval-{uuid.uuid4().hex[:12]}", "partitions": 1, "consumer_mode": "assign"},
        store={"path": str(work / "store")},
        trainer={"checkpoint_dir": str(work / "checkpoints"), "snapshot_every": 0, "push_snapshots": False,
                 "metrics_port": 0, "log_path": "", "trace_path": "", "until_end": True, "max_events": 0,
                 "idle_exit_s": 30.0,
                 "checkpoint_every_events": 10**12, "checkpoint_every_s": 1e9,  # only the final checkpoint
                 # no sketch worker runs here: count popularity in-process instead
                 "hot_source": "sample" if cfg.trainer.hot_source == "topic" else cfg.trainer.hot_source})
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    bs = 8192
    for s in range(0, len(events), bs):
        prod.send_batch(events.take(np.arange(s, min(len(events), s + bs))))
    prod.close()
    from streamrec.app.wiring import trainer_settings

    svc = TrainerService(trainer_settings(cfg), bootstrap, stop=threading.Event(), progress=False)
    out = svc.run()
    tasks = {name: {"auc": f["auc"], "logloss": f["logloss"], "events_scored": int(f["labelled"])}
             for name, f in out["tasks"].items()}
    return {"auc": out["auc"], "logloss": out["logloss"], "events_scored": int(out["events_scored"]), "tasks": tasks}


def reference_training(cfg) -> "ReferenceTraining":
    """The trainer's and the store's values a reference trains with."""
    from streamrec.model.references import ReferenceTraining

    return ReferenceTraining(batch_size=cfg.trainer.batch_size, dense_lr=cfg.trainer.dense_lr,
                             sparse_lr=cfg.store.adagrad_lr, eps=cfg.store.adagrad_eps,
                             init_scale=cfg.store.init_scale)


def reference_for(cfg) -> tuple[object | None, str]:
    """The independent reference of ``cfg``'s model, ``(progressive(cfg, events), why none)``."""
    m = cfg.model
    if m.module:
        return None, "model.module is the user's own: no independent reference"
    if len(set(m.field_dims.values())) > 1 or len(m.tables) != len(m.fields):
        return None, "fields of different widths or shared tables: the references have one table per field, one width"
    if m.architecture == "dlrm":
        from streamrec.model.references import dlrm_progressive

        return (lambda c, ev: dlrm_progressive(c.model, reference_training(c), ev)), ""
    from streamrec.model.references import ranker_progressive

    def progressive(c, ev) -> dict:
        r = ranker_progressive(c.model.architecture, c.model, reference_training(c), ev)
        return {k: r[k] for k in ("auc", "logloss", "events_scored")}

    return progressive, ""


def cmd_eval(args) -> int:
    from streamrec.app.cli import config_from_args, kafka_bootstrap
    from streamrec.ingest import layout_config

    cfg = config_from_args(args)
    reference, why = reference_for(cfg)
    if args.layout:
        cfg = dataclasses.replace(cfg, model=layout_config(args.layout, cfg.model))
    if args.seeds < 1:
        print("streamrec eval: --seeds must be >= 1", file=sys.stderr)
        return 2
    events = read_all(args.file, cfg, args.layout, args.limit)
    if len(events) == 0:
        print(f"streamrec eval: {args.file} holds no events", file=sys.stderr)
        return 1
    # DLRM's init rule needs each table's size: take it from the file when unset
    cfg = cfg.with_values(model={"fields": [
        dataclasses.replace(f, expected_ids=max(1, int(len(np.unique(events.sparse[f.name].values)))))
        if f.expected_ids == 0 and f.init_scale == 0 else f for f in cfg.model.fields]})
    seeds = [cfg.model.seed + i for i in range(args.seeds)]
    tasks = cfg.model.task_names
    ours, refs = [], []  # refs: per seed, per task, the one-task reference's figures (empty without a reference)
    with tempfile.TemporaryDirectory(prefix="streamrec-eval-") as tmp, kafka_bootstrap(cfg) as bootstrap:
        for seed in seeds:
            c = cfg.with_values(model={"seed": seed})
            if reference is not None:
                one = c.with_values(model={"tasks": c.model.tasks[:1]})
                refs.append({name: reference(one, events if len(tasks) == 1 else events.task_events(t, len(tasks)))
                             for t, name in enumerate(tasks)})
            ours.append(trainer_progressive(c, events, bootstrap, Path(tmp) / f"seed-{seed}"))
            line = f"seed {seed}: trainer AUC {ours[-1]['auc']:.5f} logloss {ours[-1]['logloss']:.5f}"
            if refs:
                line += f" | reference AUC {refs[-1][tasks[0]]['auc']:.5f} logloss {refs[-1][tasks[0]]['logloss']:.5f}"
            print(line + (f" (task {tasks[0]})" if len(tasks) > 1 else ""), flush=True)
    if reference is None:
        print(f"reference: none ({why})")

    def mean(rows: list[dict], key: str) -> float:
        return float(np.mean([r[key] for r in rows]))

    per_task = {}
    for name in tasks:
        t_rows = [o["tasks"][name] for o in ours]
        r_rows = [r[name] for r in refs]
        per_task[name] = {"auc_trainer": mean(t_rows, "auc"), "logloss_trainer": mean(t_rows, "logloss"),
                          "events_scored_trainer": min(r["events_scored"] for r in t_rows)}
        if r_rows:
            per_task[name].update(auc_reference=mean(r_rows, "auc"), logloss_reference=mean(r_rows, "logloss"),
                                  events_scored_reference=min(r["events_scored"] for r in r_rows))
    print(f"\n{len(events):,} events, model {cfg.model.module or cfg.model.architecture}, mean of {len(seeds)} seed(s)")
    print(f"{'':24}{'trainer':>12}{'reference':>12}{'difference':>12}")
    for name in tasks:
        f = per_task[name]
        if len(tasks) > 1:
            print(f"task {name}")
        for key in ("auc", "logloss"):
            a, b = f[f"{key}_trainer"], f.get(f"{key}_reference")
            ref_text = f"{b:>12.5f}{a - b:>+12.5f}" if b is not None else f"{'-':>12}{'-':>12}"
            print(f"progressive {key:<12}{a:>12.5f}{ref_text}")
        print(f"{'events scored':<24}{f['events_scored_trainer']:>12,}"
              f"{f.get('events_scored_reference', 0):>12,}")
    first = per_task[tasks[0]]
    print(json.dumps({"events": len(events), "seeds": seeds, "model": cfg.model.module or cfg.model.architecture,
                      "auc_trainer": first["auc_trainer"], "auc_reference": first.get("auc_reference"),
                      "logloss_trainer": first["logloss_trainer"], "logloss_reference": first.get("logloss_reference"),
                      "events_scored_trainer": first["events_scored_trainer"],
                      "events_scored_reference": first.get("events_scored_reference"),
                      "tasks": per_task, "per_seed": {"trainer": ours, "reference": refs},
                      "schedule": cfg.trainer.schedule, "batch_size": cfg.trainer.batch_size}))
    return 0
