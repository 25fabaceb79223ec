"""``streamrec bench sketch``: popularity-sketch updates per second vs ``collections.Counter``.

Workload: the default model's sparse fields (user, item, category, tags x3; Zipf
1.05-1.2) from the synthetic stream, in batches of 8192 events, already decoded
(the agent's per-record work after decoding). Both sides count the same ids on
one core in the same run:

- sketch:  ``PopularitySketch.update_batch`` with the configured epsilon, delta,
  half-life and top-K (decayed count-min with conservative update + heavy hitters)
- counter: one ``collections.Counter`` per field, ``update(ids.tolist())`` per batch
  (exact counts, no decay, no top-K upkeep)

``topk_recall``: of the sketch's top K (K = hot.budget_rows), the share whose true
count is at least the true K-th largest count (ties at the cut count as hits).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np


def _batches(cfg, n_events: int):
    from ingest import SyntheticStream

    s = SyntheticStream(cfg)
    s.chunk = 8192
    return list(s.batches(n_events))


def run(n_events: int, cfg) -> dict:
    from sketch import PopularitySketch

    batches = _batches(cfg, n_events)
    n_ids = int(sum(len(j.values) for b in batches for j in b.sparse.values()))
    sk = cfg.sketch
    ps = PopularitySketch(cfg.model.field_names, sk.epsilon, sk.delta, sk.half_life_s, sk.top_k)
    ps.update_batch(batches[0])  # warm-up (allocations, first-call costs), not timed
    ps = PopularitySketch(cfg.model.field_names, sk.epsilon, sk.delta, sk.half_life_s, sk.top_k)
    t = time.perf_counter()
    for b in batches:
        ps.update_batch(b)
    t_sketch = time.perf_counter() - t

    counters = {f: collections.Counter() for f in cfg.model.field_names}
    t = time.perf_counter()
    for b in batches:
        for f, j in b.sparse.items():
            counters[f].update(j.values.tolist())
    t_counter = time.perf_counter() - t

    k = min(cfg.hot.budget_rows, sk.top_k)
    all_counts = np.array([c for f in counters.values() for c in f.values()], dtype=np.int64)
    kth = int(np.partition(all_counts, len(all_counts) - k)[len(all_counts) - k]) if len(all_counts) >= k else 0
    tables, ids, _ = ps.top(k)
    names = cfg.model.field_names
    hits = sum(counters[names[t]][i] >= kth for t, i in zip(tables.tolist(), ids.tolist()))
    return {
        "events": n_events,
        "ids": n_ids,
        "distinct_ids": int(len(all_counts)),
        "k": k,
        "sketch_s": t_sketch,
        "counter_s": t_counter,
        "sketch_ids_per_s": n_ids / t_sketch,
        "counter_ids_per_s": n_ids / t_counter,
        "sketch_vs_counter": t_counter / t_sketch,
        "topk_recall": hits / k,
        "cms_shape": [ps.cms.depth, ps.cms.width],
        "epsilon": sk.epsilon,
        "delta": sk.delta,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench sketch", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300k events instead of 2M (well under 30 s)")
    ap.add_argument("--events", type=int, default=0, help="events to count (overrides --quick)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv or [])
    from streamrec.config import load_config

    cfg = load_config(None, {}, env={})
    n = args.events or (300_000 if args.quick else 2_000_000)
    r = run(n, cfg)
    print(f"sketch bench: {r['events']:,} events, {r['ids']:,} ids ({r['distinct_ids']:,} distinct), "
          f"count-min {r['cms_shape'][0]}x{r['cms_shape'][1]} (eps {r['epsilon']}, delta {r['delta']})")
    print(f"  sketch   {r['sketch_ids_per_s'] / 1e6:8.2f} M ids/s  ({r['sketch_s']:.2f} s)")
    print(f"  Counter  {r['counter_ids_per_s'] / 1e6:8.2f} M ids/s  ({r['counter_s']:.2f} s)")
    print(f"  ratio    {r['sketch_vs_counter']:8.1f} x   (goals: >= 5 M ids/s, >= 20x Counter)")
    print(f"  top-{r['k']} recall {r['topk_recall']:.4f}")
    if args.json:
        print(json.dumps({k: r[k] for k in ("sketch_ids_per_s", "counter_ids_per_s", "sketch_vs_counter",
                                            "topk_recall", "events", "ids", "k")}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
