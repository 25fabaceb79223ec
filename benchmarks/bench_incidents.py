"""``streamrec bench incidents``: the incident drills and a clean drill, on the synthetic stream and on
MovieLens-100k in time order, in one process, guarded and unguarded.

Each drill trains one trainer core (``TrainerCore``, the real store and step) on a stream with the
trainer's evidence collector attached, and "pushes" a version every ``--push-every`` events: the evidence
block of that version (the one a snapshot's manifest would carry) goes to serving's promotion guard
(``streamrec.serving.Guard``, the default ``[serving.guard]``), and the model's scores on held-out clean
events at that moment are that version's. The served version is the last one the guard promoted; unguarded,
every version is served. Serving's behaviour is all in the guard's verdicts, so one training run gives both
columns.

Streams: ``synthetic`` (the default generator) and ``movielens`` (MovieLens-100k in time order, as ``bench
quality`` reads it: ``streamrec.ingest.movielens``); the held-out events are the ones after the drill's
stretch, never trained on. Each drill runs once per seed (the model's seed; on the synthetic stream the
generator's too; the incident's random draws).

The ``clean`` drill delivers the stream as it is: every hold there is a false alarm, and the served version's
lag (events the newest version was trained on that the served one was not, at each push) is what the guard's
caution costs users on a healthy stream. The incidents, each starting half-way between two pushes and lasting
the size's incident stretch (``SIZES``):

- ``labels``: the producer sends every label as 1;
- ``label_flip``: every label arrives inverted (1 - label);
- ``dense_zero``: the first dense feature arrives as 0;
- ``random_ids``: the first field's ids are random 62-bit numbers;
- ``misaligned_join``: an upstream join is off by ``MISALIGN_ROWS`` rows: each event's ``item`` ids are those
  of the event that many rows later, every other field and the label intact.

Figures per drill: the served AUC on held-out clean events just before the incident, its largest drop from
then to the end (``auc_drop``, guarded and ``auc_drop_unguarded``), the versions pushed after the incident
reached the trainer that were promoted before the first hold (``pushes_to_hold``), the hold reasons, whether
promotion resumed after the incident and how many events after its end (``resumed``,
``resumed_after_events``), the versions held on the clean stream before it (``holds_before_incident``), and
``recovery_versions``: from the first version pushed after the stream is clean whose held-out AUC is above the
served one's, the versions until one of them is served (to the end of the run when none is:
``recovered`` false). The last JSON line holds the goals' figures: ``clean_versions_held_share`` (the larger
stream's share of clean-drill versions held, goal <= 0.02), and over every incident drill, stream and seed
``served_auc_drop_max`` (goal <= 0.01), ``pushes_to_hold_max`` (goal <= 2) and ``recovery_versions_max``
(goal <= 5); per stream the same figures and the clean drill's lag under ``streams``.

It also ends a real trainer process each of the three ways a run stops without its stream ending
(``--max-events``, SIGTERM, idle exit) while it pushes to a real server (``final_push_lag.py``):
``final_push_lag_events`` is the largest number of events the final checkpoint holds that the served
version does not (goal 0), each stop's figures under ``final_push``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STREAMS = ("synthetic", "movielens")
DRILLS = ("labels", "label_flip", "dense_zero", "random_ids", "misaligned_join")
CLEAN = "clean"  # the drill without an incident
MISALIGN_FIELD = "item"  # a field both streams' models lean on
MISALIGN_ROWS = 1_000  # how far the misaligned join's ids are taken from
# (clean events before the incident, incident, clean after, held out) per size; MovieLens holds 100,000 events
SIZES = {"tiny": (3_000, 1_500, 3_000, 2_000), "quick": (20_000, 20_000, 20_000, 10_000),
         "full": (40_000, 20_000, 30_000, 10_000)}
SEEDS = {"tiny": 1, "quick": 2, "full": 3}
GOALS = {"clean_versions_held_share": "<= 0.02", "served_auc_drop_max": "<= 0.01", "pushes_to_hold_max": "<= 2",
         "recovery_versions_max": "<= 5", "final_push_lag_events": "= 0"}


def _corrupt(events, rows: np.ndarray, drill: str, rng):
    """The events at ``rows`` of ``events`` as the incident ``drill`` delivers them (a copy)."""
    b = events.take(rows)
    if drill == "labels":
        b.labels[:] = 1.0
        if b.task_labels is not None:
            b.task_labels[:, 0] = 1.0
    elif drill == "label_flip":
        b.labels[:] = 1.0 - b.labels
        if b.task_labels is not None:
            b.task_labels[:, 0] = 1.0 - b.task_labels[:, 0]
    elif drill == "dense_zero":
        b.dense[:, 0] = 0.0
    elif drill == "random_ids":
        f = next(iter(b.sparse))
        j = b.sparse[f]
        j.values[:] = rng.integers(1, 2**62, len(j.values))
    elif drill == "misaligned_join":
        b.sparse[MISALIGN_FIELD] = events.sparse[MISALIGN_FIELD].take((rows + MISALIGN_ROWS) % len(events))
    return b


def _delivered(cfg, events, start: int, end: int, drill: str, rng):
    """``events`` as the trainer gets them: rows ``start..end`` through the incident ``drill``."""
    if drill == CLEAN or start >= end:
        return events
    parts = [events.take(np.arange(start)), _corrupt(events, np.arange(start, end), drill, rng),
             events.take(np.arange(end, len(events)))]
    return type(events).concat(parts, cfg.model.dense_dim, cfg.model.field_names)


def _versions(cfg, stream, heldout, push_every: int, path: Path) -> tuple[list, list, float]:
    """Train one core on ``stream``, a version every ``push_every`` events, each judged as serving judges it
    when pushed: ``[(first event of the window, last event + 1, evidence block, held-out AUC)]``, the guard's
    verdict on each (None: served unjudged, the first), and the seconds it took.

    The verdict reads the version's evidence and the golden set (samples of promoted windows; the promoted
    version's scores on it are kept at its promotion), so it is taken while the core is that version."""
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget, roc_auc
    from streamrec.serving import Guard
    from streamrec.serving.golden import GoldenSet
    from streamrec.snapshot import read_evidence
    from streamrec.trainer import TrainerCore, collector_for

    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(path))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    collector = collector_for(cfg.model, cfg.trainer.metrics_window, core)
    guard, golden = Guard(cfg.serving.guard), GoldenSet(cfg.serving.guard.golden_events)
    pushes, verdicts = [], []
    t0 = time.perf_counter()
    for a in range(0, len(stream), push_every):
        b = min(len(stream), a + push_every)
        core.feed(stream.take(np.arange(a, b)), flush=True)
        ev = collector.take(0).to_block()  # the manifest's form, as serving's guard gets it
        auc = roc_auc(heldout.labels, core.predict(heldout)[:, 0])
        pushes.append((a, b, ev, float(auc)))
        first = not guard.history.promoted
        verdict = None if first else guard.decide(ev, golden.compare(core.predict))
        if verdict is None or verdict.ok:
            guard.reset(ev) if first else guard.promoted(ev)
            golden.promoted(read_evidence(ev).sample, core.predict, cfg.model.field_names, cfg.model.dense_dim)
        verdicts.append(verdict)
    store.close()
    return pushes, verdicts, time.perf_counter() - t0


def _served_figures(pushes: list, served: list[int], end: int) -> dict:
    """What users got in a guarded run that served the versions at ``served`` (indices into ``pushes``): the
    versions held (every one but the first is judged), the served version's lag behind the newest at each push
    (events the newest was trained on and the served one was not), and the recovery: from the first version
    pushed after the stream is clean (its window starts at ``end`` or later) whose held-out AUC is above the
    served one's, the versions until one of them is served (to the end of the run when none is)."""
    promoted = set(served)
    lags, current, first, recovery = [], 0, None, None
    for i, (a, b, _ev, auc, *_rest) in enumerate(pushes):
        if recovery is None and first is None and a >= end and auc > pushes[current][3]:
            first = i
        if i in promoted:
            current = i
            if first is not None and recovery is None:
                recovery = i - first
        lags.append(b - pushes[current][1])
    if recovery is None:  # none was served: the versions to the end of the run, a lower bound
        recovery, recovered = (len(pushes) - first, False) if first is not None else (0, True)
    else:
        recovered = True
    return {"versions_held": len(pushes) - len(promoted), "versions_judged": len(pushes) - 1,
            "served_lag_events_mean": float(np.mean(lags)), "served_lag_events_max": int(max(lags)),
            "recovery_versions": recovery, "recovered": recovered}


def drill(cfg, events, heldout, drill_name: str, pre: int, incident: int, post: int, push_every: int,
          workdir: Path, seed: int = 0) -> dict:
    start = pre + push_every // 2  # the incident starts half-way between two pushes
    end = start + incident
    total = pre + incident + post
    stream = _delivered(cfg, events.take(np.arange(total)), start, end, drill_name, np.random.default_rng(seed))
    pushes, verdicts, seconds = _versions(cfg, stream, heldout, push_every, workdir / f"store-{drill_name}-{seed}")

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
    served = _served_figures(pushes, [i for i, v in enumerate(verdicts) if v is None or v.ok], end)
    return {"drill": drill_name, "seed": seed, "versions": len(pushes), "train_seconds": seconds, **g, **served,
            "auc_drop_unguarded": u["auc_drop"]}


def _stream_events(stream: str, seed: int, n: int):
    """(config, the first ``n`` events) of ``stream`` for ``seed``: bench quality's config and events (the
    synthetic generator's seed moved by ``seed`` too)."""
    from .bench_quality import _config, _events

    over = {"model.seed": seed}
    if stream == "synthetic":
        from streamrec.ingest.ingest_config import GeneratorConfig

        over["generator.seed"] = GeneratorConfig.seed + seed
    cfg = _config(stream, over)
    if stream == "synthetic":
        from streamrec.foundation import EventBatch
        from streamrec.ingest import SyntheticStream

        events = EventBatch.concat(list(SyntheticStream(cfg).batches(n)), cfg.model.dense_dim, cfg.model.field_names)
        return cfg, events
    return cfg, _events(stream, cfg, n)[0]


def _summary(drills: list[dict]) -> dict:
    """The goals' figures over ``drills`` (clean ones for the held share and lag, incident ones for the rest)."""
    clean = [d for d in drills if d["drill"] == CLEAN]
    bad = [d for d in drills if d["drill"] != CLEAN]
    judged = sum(d["versions_judged"] for d in clean)
    return {
        "clean_versions_held_share": sum(d["versions_held"] for d in clean) / max(1, judged),
        "clean_versions_held": sum(d["versions_held"] for d in clean), "clean_versions_judged": judged,
        "served_lag_events_mean": float(np.mean([d["served_lag_events_mean"] for d in clean])),
        "served_lag_events_max": max(d["served_lag_events_max"] for d in clean),
        "served_auc_drop_max": max(d["auc_drop"] for d in bad),
        "served_auc_drop_max_unguarded": max(d["auc_drop_unguarded"] for d in bad),
        "pushes_to_hold_max": max(d["pushes_to_hold"] for d in bad),
        "recovery_versions_max": max(d["recovery_versions"] for d in bad),
        "recovered_all": all(d["recovered"] for d in bad),
        "resumed_all": all(d["resumed"] for d in bad),
    }


def run(pre: int, incident: int, post: int, push_every: int, heldout_n: int, threads: int,
        seeds: list[int], streams: tuple[str, ...] = STREAMS, echo=None, final_push: dict | None = None) -> dict:
    """The drills (module doc); ``final_push``: the stops' figures (``final_push_lag.final_push_lag_events``)
    to report with them."""
    import torch

    torch.set_num_threads(threads)
    total = pre + incident + post
    drills, per_stream, seconds = [], {}, {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="streamrec-bench-incidents-") as tmp:
        for stream in streams:
            t1 = time.perf_counter()
            mine = []
            for seed in seeds:
                cfg, events = _stream_events(stream, seed, total + heldout_n)
                if len(events) < total + heldout_n:
                    raise SystemExit(f"bench incidents: {stream} holds {len(events)} events, the drills need "
                                     f"{total + heldout_n}")
                heldout = events.take(np.arange(total, total + heldout_n))  # later clean events, never trained on
                work = Path(tmp) / stream
                mine.append(drill(cfg, events, heldout, CLEAN, total, 0, 0, push_every, work, seed))
                mine += [drill(cfg, events, heldout, d, pre, incident, post, push_every, work, seed) for d in DRILLS]
                for d in mine[-1 - len(DRILLS):]:
                    d["stream"] = stream
                    if echo:
                        echo(d)
            drills += mine
            per_stream[stream] = _summary(mine)
            seconds[stream] = round(time.perf_counter() - t1, 1)
            per_stream[stream]["seconds"] = seconds[stream]
    every = _summary(drills)
    return {
        "clean_versions_held_share": max(s["clean_versions_held_share"] for s in per_stream.values()),
        **{k: every[k] for k in ("served_auc_drop_max", "served_auc_drop_max_unguarded", "pushes_to_hold_max",
                                 "recovery_versions_max", "recovered_all", "resumed_all")},
        **({"final_push_lag_events": final_push["final_push_lag_events"]} if final_push else {}),
        "streams": per_stream,
        "drills": drills,
        **({"final_push": final_push} if final_push else {}),
        "events": {"pre": pre, "incident": incident, "post": post, "push_every": push_every, "heldout": heldout_n,
                   "misalign_rows": MISALIGN_ROWS},
        "seeds": seeds,
        "seconds": round(time.perf_counter() - t0, 1),
        "goals": GOALS,
    }


def _line(d: dict) -> str:
    if d["drill"] == CLEAN:
        return (f"{d['stream']:<9} seed {d['seed']} clean            held {d['versions_held']} of "
                f"{d['versions_judged']} {d['held']}  served lag mean {d['served_lag_events_mean']:.0f} max "
                f"{d['served_lag_events_max']} events  ({d['versions']} versions, {d['train_seconds']:.1f} s)")
    return (f"{d['stream']:<9} seed {d['seed']} {d['drill']:<16} served AUC before {d['auc_pre']:.4f}  drop guarded "
            f"{d['auc_drop']:.4f} unguarded {d['auc_drop_unguarded']:.4f}  promoted before the first hold "
            f"{d['pushes_to_hold']}  held {d['held']} (before the incident {d['holds_before_incident']})  "
            f"recovery {d['recovery_versions']} versions{'' if d['recovered'] else ' (not recovered)'}  "
            f"({d['versions']} versions, {d['train_seconds']:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench incidents", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a shorter stream, 2 seeds (noisier)")
    p.add_argument("--tiny", action="store_true", help="a smoke run: checks the bench works, its figures mean little")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--push-every", type=int, default=0, help="events between versions (default 1000, tiny 500)")
    p.add_argument("--seeds", type=int, default=0, help="seeds per drill (default 3, quick 2, tiny 1)")
    p.add_argument("--stream", choices=("all", *STREAMS), default="all", help="which stream to drill on")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--bootstrap", help="the final-push stops' Kafka cluster (default: an embedded broker)")
    a = p.parse_args(argv)
    size = "tiny" if a.tiny else "quick" if a.quick else "full"
    pre, incident, post, heldout = SIZES[size]
    push_every = a.push_every or (500 if a.tiny else 1_000)
    seeds = list(range(a.seeds or SEEDS[size]))
    streams = STREAMS if a.stream == "all" else (a.stream,)
    from .final_push_lag import final_push_lag_events

    stops = final_push_lag_events(size == "tiny", a.bootstrap)
    for st in stops["stops"].values():
        print(f"final push, {st['stop']:<10} checkpoint {st['checkpoint_events']:,} events, served v{st['served_version']}"
              f" {st['served_events']:,} (lag {st['lag_events']:,}), exit {st['exit_code']}", flush=True)
    r = run(pre, incident, post, push_every, heldout, a.threads, seeds, streams,
            echo=lambda d: print(_line(d), flush=True), final_push=stops)
    for name, s in r["streams"].items():
        print(f"{name}: clean versions held {s['clean_versions_held']} of {s['clean_versions_judged']} "
              f"({s['clean_versions_held_share']:.3f}), served lag mean {s['served_lag_events_mean']:.0f} max "
              f"{s['served_lag_events_max']} events; drop {s['served_auc_drop_max']:.4f} (unguarded "
              f"{s['served_auc_drop_max_unguarded']:.4f}), to hold {s['pushes_to_hold_max']}, recovery "
              f"{s['recovery_versions_max']} ({s['seconds']:.0f} s)")
    print(f"clean_versions_held_share {r['clean_versions_held_share']:.3f} (goal <= 0.02); served_auc_drop_max "
          f"{r['served_auc_drop_max']:.4f} (goal <= 0.01), unguarded {r['served_auc_drop_max_unguarded']:.4f}; "
          f"pushes_to_hold_max {r['pushes_to_hold_max']} (goal <= 2); recovery_versions_max "
          f"{r['recovery_versions_max']} (goal <= 5); final_push_lag_events {r['final_push_lag_events']} (goal 0, "
          f"largest over {', '.join(stops['stops'])}); {r['seconds']:.0f} s")
    if a.json:
        print(json.dumps(r))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
