"""``streamrec bench sketch``: popularity-sketch updates per second vs ``collections.Counter``.

Workload: the default model's sparse fields (user, item, category, tags x3; Zipf
1.05-1.2) from the synthetic stream, in records of 8192 events, already decoded
(the agent's per-record work after decoding). Everything runs on one core in the
same run, over the same ids:

- sketch: ``PopularitySketch.update_batch`` per record with the configured
  epsilon, delta, half-life and top-K (decayed count-min with conservative
  update + heavy hitters; compiled kernels, ``sketch/kernels.py``), default
  pre-aggregation buffer, timed up to and including the final ``flush()`` (so
  every id is in the counts). The kernels are compiled or loaded from numba's
  on-disk cache before timing; that one-off cost is ``jit_warm_s``.
- counter, batched (the strongest Python baseline; ``sketch_vs_counter``): one
  ``Counter`` per field, ``update(values.tolist())`` per record -- exact counts,
  no decay, no top-K upkeep. ``tolist()`` is timed: a service holding the decoded
  numpy columns has to make Python ints to use a Counter.
- counter, per event (``sketch_vs_counter_per_event``): one ``Counter`` of
  ``(field, id)`` keys, ``update([...])`` with each event's keys, events already
  Python dicts of lists (as a JSON consumer gets them; building them is not
  timed). Measured on at most the first 300k events (memory), rate per id.

``topk_recall``: of the sketch's top K (K = hot.budget_rows), the share whose
true *decayed* count (the quantity the sketch ranks by; exact, numpy, untimed)
is at least the true K-th largest (ties at the cut count as hits).
``topk_recall_undecayed`` uses plain counts instead (the stream spans minutes
against a 10-minute half-life, so these rankings differ near the cut).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np


def _batches(cfg, n_events: int):
    from streamrec.ingest import SyntheticStream

    s = SyntheticStream(cfg)
    s.chunk = 8192
    return list(s.batches(n_events))


def _recall(ps, batches, names, k: int, decayed: bool) -> float:
    """Share of the sketch's top k whose true (decayed) count reaches the true k-th largest."""
    truth = {}
    for f in names:
        vals = np.concatenate([b.sparse[f].values for b in batches])
        ts = np.concatenate([np.repeat(b.ts, b.sparse[f].lengths) for b in batches])
        u, inv = np.unique(vals, return_inverse=True)
        w = np.exp2((ts - ps.now_ms) / ps.half_life_ms) if decayed else None
        truth[f] = (u, np.bincount(inv.reshape(-1), weights=w, minlength=len(u)))
    allc = np.concatenate([c for _, c in truth.values()])
    if len(allc) < k:
        return 1.0
    kth = np.partition(allc, len(allc) - k)[len(allc) - k]
    tables, ids, _ = ps.top(k)
    hits = 0
    for t, f in enumerate(names):
        got = ids[tables == t]
        u, c = truth[f]
        pos = np.clip(np.searchsorted(u, got), 0, len(u) - 1)
        hits += int(np.sum((u[pos] == got) & (c[pos] >= kth * (1 - 1e-9))))
    return hits / k


def _per_event_rate(batches, max_events: int) -> float:
    evs, n_ids = [], 0
    for b in batches:
        cols = {f: (j.values.tolist(), j.offsets.tolist()) for f, j in b.sparse.items()}
        for r in range(len(b)):
            evs.append({f: v[o[r]:o[r + 1]] for f, (v, o) in cols.items()})
        if len(evs) >= max_events:
            break
    evs = evs[:max_events]
    n_ids = sum(len(x) for e in evs for x in e.values())
    c = collections.Counter()
    t = time.perf_counter()
    for e in evs:
        c.update([(f, i) for f, ids in e.items() for i in ids])
    return n_ids / (time.perf_counter() - t)


def run(n_events: int, cfg) -> dict:
    from streamrec.sketch import PopularitySketch
    from streamrec.sketch.kernels import warm as warm_kernels

    jit_warm_s = warm_kernels()  # compile / cache load, once per process: not throughput
    batches = _batches(cfg, n_events)
    n_ids = int(sum(len(j.values) for b in batches for j in b.sparse.values()))
    sk = cfg.sketch
    names = cfg.model.field_names

    def new():
        return PopularitySketch(names, sk.epsilon, sk.delta, sk.half_life_s, sk.top_k)

    warm = new()  # warm-up (first-call costs), not timed
    for b in batches[:40]:
        warm.update_batch(b)
    warm.flush()
    ps = new()
    t = time.perf_counter()
    for b in batches:
        ps.update_batch(b)
    ps.flush()
    t_sketch = time.perf_counter() - t

    counters = {f: collections.Counter() for f in names}
    t = time.perf_counter()
    for b in batches:
        for f, j in b.sparse.items():
            counters[f].update(j.values.tolist())
    t_counter = time.perf_counter() - t
    per_event = _per_event_rate(batches, 300_000)

    k = min(cfg.hot.budget_rows, sk.top_k)
    sketch_rate = n_ids / t_sketch
    return {
        "events": n_events,
        "ids": n_ids,
        "distinct_ids": int(sum(len(c) for c in counters.values())),
        "k": k,
        "sketch_s": t_sketch,
        "jit_warm_s": jit_warm_s,
        "counter_s": t_counter,
        "sketch_ids_per_s": sketch_rate,
        "counter_ids_per_s": n_ids / t_counter,
        "counter_per_event_ids_per_s": per_event,
        "sketch_vs_counter": t_counter / t_sketch,
        "sketch_vs_counter_per_event": sketch_rate / per_event,
        "topk_recall": _recall(ps, batches, names, k, decayed=True),
        "topk_recall_undecayed": _recall(ps, batches, names, k, decayed=False),
        "cms_shape": [ps.cms.depth, ps.cms.width],
        "buffer_ids": ps.buffer_ids,
        "epsilon": sk.epsilon,
        "delta": sk.delta,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench sketch", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300k events instead of 2M (well under 30 s)")
    ap.add_argument("--events", type=int, default=0, help="events to count (overrides --quick)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    args = ap.parse_args(argv or [])
    from streamrec.app.config import load_config

    cfg = load_config(None, {}, env={})
    n = args.events or (20_000 if args.tiny else 300_000 if args.quick else 2_000_000)
    r = run(n, cfg)
    print(f"sketch bench: {r['events']:,} events, {r['ids']:,} ids ({r['distinct_ids']:,} distinct), "
          f"count-min {r['cms_shape'][0]}x{r['cms_shape'][1]} (eps {r['epsilon']}, delta {r['delta']}), "
          f"full count (no sampling), buffer {r['buffer_ids']:,} ids")
    print(f"  sketch                   {r['sketch_ids_per_s'] / 1e6:8.2f} M ids/s  ({r['sketch_s']:.2f} s)")
    print(f"  Counter, batched         {r['counter_ids_per_s'] / 1e6:8.2f} M ids/s  "
          f"(per-field update(values.tolist()) per record)  ratio {r['sketch_vs_counter']:6.1f} x")
    print(f"  Counter, per event       {r['counter_per_event_ids_per_s'] / 1e6:8.2f} M ids/s  "
          f"(update of each event's (field, id) keys)     ratio {r['sketch_vs_counter_per_event']:6.1f} x")
    print("  goals: >= 5 M ids/s, >= 20x Counter")
    print(f"  kernel compile / cache load before timing: {r['jit_warm_s']:.2f} s (not counted)")
    print(f"  top-{r['k']} recall {r['topk_recall']:.4f} (decayed truth), "
          f"{r['topk_recall_undecayed']:.4f} (undecayed truth)")
    if args.json:
        print(json.dumps({k: r[k] for k in (
            "sketch_ids_per_s", "counter_ids_per_s", "sketch_vs_counter", "topk_recall",
            "counter_per_event_ids_per_s", "sketch_vs_counter_per_event", "topk_recall_undecayed",
            "events", "ids", "k", "buffer_ids", "jit_warm_s")}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
