"""``streamrec bench incidents``: the incident drills, in one process, guarded and unguarded.

Each drill trains one trainer core (``TrainerCore``, the real store and step) on a synthetic stream with the
trainer's evidence collector attached, and "pushes" a version every ``--push-every`` events: the evidence
block of that version (the one a snapshot's manifest would carry) goes to serving's promotion guard
(``streamrec.serving.Guard``, the default ``[serving.guard]``), and the model's scores on held-out clean
events at that moment are that version's. The served version is the last one the guard promoted; unguarded,
every version is served. Serving's behaviour is all in the guard's verdicts, so one training run gives both
columns. The incidents, each starting half-way between two pushes and lasting ``--incident`` events:

- ``labels``: the producer sends every label as 1;
- ``dense_zero``: the first dense feature arrives as 0;
- ``random_ids``: the first field's ids are random 62-bit numbers.

Figures per drill: the served AUC on held-out clean events just before the incident, its largest drop from
then to the end (``auc_drop``, guarded and ``auc_drop_unguarded``), the versions pushed after the incident
reached the trainer that were promoted before the first hold (``pushes_to_hold``), the hold reasons, whether
promotion resumed after the incident and how many events after its end (``resumed``,
``resumed_after_events``), and the versions held on the clean stream before it (``holds_before_incident``:
the guard's false alarms). The last JSON line holds ``served_auc_drop_max``
(worst drill, goal <= 0.01), ``served_auc_drop_max_unguarded`` and ``pushes_to_hold_max`` (goal <= 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DRILLS = ("labels", "dense_zero", "random_ids")


def _corrupt(batch, drill: str, rng):
    b = batch.take(np.arange(len(batch)))  # a copy
    if drill == "labels":
        b.labels[:] = 1.0
        if b.task_labels is not None:
            b.task_labels[:, 0] = 1.0
    elif drill == "dense_zero":
        b.dense[:, 0] = 0.0
    elif drill == "random_ids":
        f = next(iter(b.sparse))
        j = b.sparse[f]
        j.values[:] = rng.integers(1, 2**62, len(j.values))
    return b


def drill(cfg, events, heldout, drill_name: str, pre: int, incident: int, post: int, push_every: int,
          workdir: Path) -> dict:
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget, roc_auc
    from streamrec.serving import Guard
    from streamrec.serving.golden import GoldenSet
    from streamrec.snapshot import read_evidence
    from streamrec.trainer import TrainerCore, collector_for

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(workdir / f"store-{drill_name}"))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    collector = collector_for(cfg.model, cfg.trainer.metrics_window, core)
    rng = np.random.default_rng(7)
    start = pre + push_every // 2  # the incident starts half-way between two pushes
    end = start + incident
    total = pre + incident + post
    pushes = []  # (first event of the window, last event + 1, evidence, held-out AUC)
    guard, golden, verdicts = Guard(cfg.serving.guard), GoldenSet(cfg.serving.guard.golden_events), []

    def judge(ev) -> None:
        """The guarded replay's verdict on the version just pushed, as serving gives it: on its evidence and on
        the golden set (promoted windows' samples; the promoted version's scores kept at its promotion)."""
        first = not guard.history.promoted
        verdict = None if first else guard.decide(ev, golden.compare(core.predict))
        if verdict is None or verdict.ok:
            guard.reset(ev) if first else guard.promoted(ev)
            golden.promoted(read_evidence(ev).sample, core.predict, cfg.model.field_names, cfg.model.dense_dim)
        verdicts.append(verdict)

    t0 = time.perf_counter()
    for a in range(0, total, push_every):
        b = min(total, a + push_every)
        window = events.take(np.arange(a, b))
        lo, hi = max(a, start), min(b, end)
        if lo < hi:  # the incident's events of this window
            mask = np.zeros(len(window), bool)
            mask[lo - a:hi - a] = True
            bad = _corrupt(window.take(np.flatnonzero(mask)), drill_name, rng)
            window = type(window).concat([window.take(np.arange(lo - a)), bad, window.take(np.arange(hi - a, b - a))],
                                         cfg.model.dense_dim, cfg.model.field_names)
        core.feed(window, flush=True)
        ev = collector.take(0).to_block()  # the manifest's form, as serving's guard gets it
        auc = roc_auc(heldout.labels, core.predict(heldout)[:, 0])
        pushes.append((a, b, ev, float(auc)))
        judge(ev)
    store.close()
    seconds = time.perf_counter() - t0

    def serve(guarded: bool) -> dict:
        served_auc, pre_auc, drop, to_hold, held_seen, resumed, reasons = None, None, 0.0, 0, False, False, {}
        false_holds, resumed_after = 0, None
        for (a, b, ev, auc), verdict in zip(pushes, verdicts if guarded else [None] * len(pushes)):
            ok = verdict is None or verdict.ok
            if ok:
                served_auc = auc
            else:
                reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
            if b <= start:
                pre_auc = served_auc
                false_holds += not ok
                continue
            if ok and not held_seen and a < end:
                to_hold += 1  # a version the incident reached, promoted before the first hold
            held_seen = held_seen or not ok
            if a >= end and ok and not resumed:
                resumed, resumed_after = True, a - end  # events after the incident ended
            drop = max(drop, pre_auc - served_auc)
        return {"auc_pre": pre_auc, "auc_drop": drop, "pushes_to_hold": to_hold, "held": reasons,
                "resumed": resumed, "resumed_after_events": resumed_after, "holds_before_incident": false_holds}

    g, u = serve(True), serve(False)
    return {"drill": drill_name, "versions": len(pushes), "train_seconds": seconds, **g,
            "auc_drop_unguarded": u["auc_drop"]}


def run(pre: int, incident: int, post: int, push_every: int, heldout_n: int, threads: int) -> dict:
    import torch

    from streamrec.foundation import EventBatch
    from streamrec.app.config import load_config
    from streamrec.ingest import SyntheticStream

    torch.set_num_threads(threads)
    cfg = load_config(None, {"trainer.device": "cpu"}, env={})
    total = pre + incident + post
    s = SyntheticStream(cfg)
    events = EventBatch.concat(list(s.batches(total + heldout_n)), cfg.model.dense_dim, cfg.model.field_names)
    heldout = events.take(np.arange(total, total + heldout_n))  # later clean events, never trained on
    events = events.take(np.arange(total))
    with tempfile.TemporaryDirectory(prefix="streamrec-bench-incidents-") as tmp:
        drills = [drill(cfg, events, heldout, d, pre, incident, post, push_every, Path(tmp)) for d in DRILLS]
    return {
        "served_auc_drop_max": max(d["auc_drop"] for d in drills),
        "served_auc_drop_max_unguarded": max(d["auc_drop_unguarded"] for d in drills),
        "pushes_to_hold_max": max(d["pushes_to_hold"] for d in drills),
        "resumed_all": all(d["resumed"] for d in drills),
        "drills": drills,
        "events": {"pre": pre, "incident": incident, "post": post, "push_every": push_every, "heldout": heldout_n},
        "goals": {"served_auc_drop_max": "<= 0.01", "pushes_to_hold_max": "<= 2"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench incidents", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a shorter stream (noisier)")
    p.add_argument("--tiny", action="store_true", help="a smoke run: checks the bench works, its figures mean little")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--push-every", type=int, default=0, help="events between versions (default 1000, tiny 500)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    a = p.parse_args(argv)
    if a.tiny:
        pre, incident, post, heldout = 3_000, 1_500, 3_000, 2_000
    elif a.quick:
        pre, incident, post, heldout = 15_000, 5_000, 10_000, 5_000
    else:
        pre, incident, post, heldout = 40_000, 10_000, 30_000, 10_000
    push_every = a.push_every or (500 if a.tiny else 1_000)
    r = run(pre, incident, post, push_every, heldout, a.threads)
    for d in r["drills"]:
        print(f"{d['drill']:<11} served AUC before {d['auc_pre']:.4f}  drop guarded {d['auc_drop']:.4f}  "
              f"unguarded {d['auc_drop_unguarded']:.4f}  promoted before the first hold {d['pushes_to_hold']}  "
              f"held {d['held']} (before the incident {d['holds_before_incident']})  resumed {d['resumed']} "
              f"(after {d['resumed_after_events']} events)  ({d['versions']} versions, {d['train_seconds']:.1f} s)")
    print(f"served_auc_drop_max {r['served_auc_drop_max']:.4f} (goal <= 0.01), unguarded "
          f"{r['served_auc_drop_max_unguarded']:.4f}; pushes_to_hold_max {r['pushes_to_hold_max']} (goal <= 2)")
    if a.json:
        print(json.dumps(r))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
