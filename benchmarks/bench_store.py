"""``streamrec bench store``: tiered embedding store vs in-memory ceiling and RocksDB floor.

Workload: Zipf(1.05) ids over N rows (10M, or 1M with --quick), dim 16, batches of
4096 lookups; per batch: unique ids -> lookup -> per-row gradient (sum over the
batch's occurrences) -> row-wise sparse update. Three set-ups, each in its own fresh
subprocess so its peak RSS (``ru_maxrss``) is its own:

- memory: one ``torch.nn.Embedding(N, 16, sparse=True)`` + ``torch.optim.Adagrad`` (ceiling)
- rocks:  EmbeddingStore with no hot tier and no host cache (every row from RocksDB; floor)
- tiered: EmbeddingStore with the top 1% ids in the hot tier, a write-back host cache of
  ``--cache-pct`` (default 2.5%, which keeps its peak RSS under the 0.25x-of-memory goal at 10M
  ids; BENCHMARKS.md has the figures) of the ids for recently used cold rows, next batch
  prefetched. Its peak RSS includes the cache.

Both store set-ups use the same RocksDB settings (4 shards, 8 MB block cache, 8 MB of
write buffers in all): random single-row reads over 10M ids gain nothing measurable
from a larger block cache (the OS page cache, outside the process, holds the files),
while a larger cache and larger write buffers add resident memory at the same speed.

Store set-ups start empty: rows are created on first touch, as in online training.
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

from .common import add_device_arg, bench_device, sync

DIM = 16
BATCH = 4096
ZIPF = 1.05
_A = 2_654_435_761  # odd multiplier: rank -> row is a bijection on [0, N) scattering hot rows


def _id_stream(n_ids: int, batches: int, seed: int = 1):
    from streamrec.ingest.synthetic import zipf_ranks  # ingest's package imports are lazy: no Kafka or pyarrow here

    rng = np.random.default_rng(seed)
    for _ in range(batches):
        r = zipf_ranks(rng, BATCH, n_ids, ZIPF)
        yield (r * _A + 12345) % n_ids


def _rows_of_ranks(ranks: np.ndarray, n_ids: int) -> np.ndarray:
    return (ranks * _A + 12345) % n_ids


def _io(store) -> dict:
    """The store's RocksDB counters: rows read (not answered by the key filter), rows written, seconds in each."""
    if store is None:
        return {}
    st = store.stats()
    return {"rocks_rows_read": st["cold_reads"] - st["cold_reads_skipped"], "rocks_rows_written": st["cold_rows_written"],
            "rocks_read_s": st["cold_read_s"], "rocks_write_s": st["cold_write_s"]}


def traffic_bound(n_ids: int, hot_rows: int, cache_rows: int) -> dict:
    """RocksDB rows per batch of the all-RocksDB set-up over those of a tiered one whose host
    cache holds the next-most-popular ``cache_rows`` ids (the best a cache of that size can do
    on an i.i.d. stream), from the id stream's own rank probabilities.

    Each unique row of a batch costs a RocksDB read and write in the all-RocksDB set-up, and
    each unique row outside the hot set and the cache does in the tiered one; if nothing
    else cost time, ``tiered/rocks`` could not exceed this ratio without hiding RocksDB work
    behind other work.
    """
    a = 1.0 - ZIPF  # the inverse-CDF sampler of ingest.synthetic.zipf_ranks: P(rank < r) = ((r+1)^a - 1) / C
    cdf = (np.arange(1, n_ids + 2, dtype=np.float64) ** a - 1.0) / ((n_ids + 1.0) ** a - 1.0)
    p = np.diff(cdf)
    p[-1] += 1.0 - cdf[-1]  # the sampler clips the tail into the last rank
    in_batch = -np.expm1(BATCH * np.log1p(-p))  # P(a row appears in one batch)
    all_rows = float(in_batch.sum())
    outside = float(in_batch[hot_rows + cache_rows:].sum())
    return {"unique_rows_per_batch": round(all_rows, 1), "rocks_rows_per_batch_best_cache": round(outside, 1),
            "hot_lookup_share": round(float(p[:hot_rows].sum()), 4),
            "tiered_vs_rocks_traffic_bound": round(all_rows / max(outside, 1e-9), 2)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(setup: str, n_ids: int, warm: int, seconds: float, path: str, cache_pct: float = 2.0,
            admission: str = "frequency", device: str = "cpu") -> dict:
    import torch

    torch.set_num_threads(1)
    dev = torch.device(device)
    if setup != "memory":
        from streamrec.embedding_store import EmbeddingStore, StoreSpec  # the runtime, before any table data
    runtime_mb = _rss_mb()  # the fixed runtime (interpreter, numpy, torch, the store's code): not the table
    stream = _id_stream(n_ids, 10**9)
    gen = torch.Generator().manual_seed(0)
    G = (torch.randn(BATCH, DIM, generator=gen) * 0.01).to(dev)
    done = 0
    occ_hot = occ = 0
    if setup == "memory":
        emb = torch.nn.Embedding(n_ids, DIM, sparse=True, device=dev)
        opt = torch.optim.Adagrad(emb.parameters(), lr=0.05)

        def step(ids):
            t = torch.from_numpy(ids).to(dev)
            loss = (emb(t) * G).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        store = None
    else:
        hot = n_ids // 100 if setup == "tiered" else 0
        cache = int(n_ids * cache_pct / 100) if setup == "tiered" else 0
        store = EmbeddingStore(StoreSpec(path, {"t": DIM}, shards=4, device=dev, hot_capacity_rows=hot,
                                         block_cache_mb=8, memtable_mb=8, host_cache_rows=cache,
                                         cache_admission=admission))
        if hot:
            store.set_hot({"t": _rows_of_ranks(np.arange(hot), n_ids)})
        pending = [None]

        def step(ids):
            uniq, inv = np.unique(ids, return_inverse=True)
            nxt = next(stream)
            if setup == "tiered":
                pending[0] = nxt
            rows = store.lookup("t", uniq)
            inv_t = torch.from_numpy(inv).to(dev)
            out = rows[inv_t]
            del out
            g = torch.zeros(len(uniq), DIM, device=dev).index_add_(0, inv_t, G)
            if setup == "tiered" and os.environ.get("BENCH_STORE_PREFETCH", "1") == "1":
                store.prefetch("t", pending[0])
            store.apply_gradients("t", uniq, g)
            return nxt
    ids = next(stream)
    for _ in range(warm):
        r = step(ids)
        ids = r if r is not None else next(stream)
    sync(dev)
    io0 = _io(store)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        r = step(ids)
        ids = r if r is not None else next(stream)
        done += 1
    sync(dev)  # the batches' queued device work counts in the time
    dt = time.perf_counter() - t0
    out = {"setup": setup, "device": str(dev), "rows_per_s": done * BATCH / dt, "batches": done, "seconds": dt,
           "ms_per_batch": dt / done * 1e3}
    if store is not None:  # where the timed batches' RocksDB time went (per batch)
        out.update({k: (v - io0[k]) / done * (1e3 if k.endswith("_s") else 1)
                    for k, v in _io(store).items()})  # hit rate over id occurrences (lookups), not unique rows; the hot
        for _ in range(50):  # set is fixed, so it is measured after the timed loop, not in it
            ids = next(stream)
            occ_hot += int(store.hot_mask("t", ids).sum())
            occ += len(ids)
        out["hot_hit_rate"] = occ_hot / max(1, occ)
        st = store.stats()
        out["cold_rows"] = st["cold_rows"]
        if st["cache_hits"] + st["cache_misses"]:
            out["cache_hit_rate"] = st["cache_hits"] / (st["cache_hits"] + st["cache_misses"])
            out["cache_mb"] = st["cache_bytes"] / 2**20
        store.close()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["runtime_rss_mb"] = runtime_mb
    out["table_mb"] = out["peak_rss_mb"] - runtime_mb  # what the table costs: peak over the runtime's own
    return out


def _run_setup(setup: str, n_ids: int, warm: int, seconds: float, cache_pct: float,
               admission: str = "frequency", device: str = "cpu") -> dict:
    tmp = tempfile.mkdtemp(prefix=f"bench-store-{setup}-")
    code = ("import json,sys; from streamrec.benchmarks.bench_store import _worker; "
            f"print(json.dumps(_worker({setup!r}, {n_ids}, {warm}, {seconds}, {tmp + '/db'!r}, {cache_pct}, "
            f"{admission!r}, {device!r})))")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=seconds * 4 + 240, cwd=os.path.dirname(os.path.dirname(__file__)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if res.returncode != 0:
        raise RuntimeError(f"set-up {setup} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def cache_traffic(n_ids: int, warm: int, counted: int, cache_pct: float, admission: str, device: str = "cpu") -> dict:
    """RocksDB rows read and written per batch by the tiered set-up over ``counted`` batches after
    ``warm`` ones, untimed: the cache policy's own figure, the same on a loaded machine (prefetch off,
    so every count is the main loop's). Compare with ``rocks_rows_per_batch_best_cache``."""
    import torch

    torch.set_num_threads(1)
    from streamrec.embedding_store import EmbeddingStore, StoreSpec

    dev = torch.device(device)
    tmp = tempfile.mkdtemp(prefix="bench-store-traffic-")
    hot, cache = n_ids // 100, int(n_ids * cache_pct / 100)
    store = EmbeddingStore(StoreSpec(tmp + "/db", {"t": DIM}, shards=4, device=dev, hot_capacity_rows=hot,
                                     block_cache_mb=8, memtable_mb=8, host_cache_rows=cache,
                                     cache_admission=admission))
    try:
        store.set_hot({"t": _rows_of_ranks(np.arange(hot), n_ids)})
        G = (torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0)) * 0.01).to(dev)
        stream = _id_stream(n_ids, warm + counted)
        io0 = None
        for i, ids in enumerate(stream):
            if i == warm:
                io0, st0 = _io(store), store.stats()
            uniq, inv = np.unique(ids, return_inverse=True)
            store.lookup("t", uniq)
            g = torch.zeros(len(uniq), DIM, device=dev).index_add_(0, torch.from_numpy(inv).to(dev), G)
            store.apply_gradients("t", uniq, g)
        io1, st1 = _io(store), store.stats()
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    hits, misses = st1["cache_hits"] - st0["cache_hits"], st1["cache_misses"] - st0["cache_misses"]
    out = {"device": str(dev), "admission": admission, "warm_batches": warm, "counted_batches": counted,
           "rocks_rows_read_per_batch": round((io1["rocks_rows_read"] - io0["rocks_rows_read"]) / counted, 1),
           "rocks_rows_written_per_batch": round((io1["rocks_rows_written"] - io0["rocks_rows_written"]) / counted, 1),
           "cache_hit_rate": round(hits / max(1, hits + misses), 4)}
    out.update(traffic_bound(n_ids, hot, cache))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench store", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M ids, short runs (< 50 s)")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    ap.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per set-up")
    ap.add_argument("--cache-pct", type=float, default=2.5,
                    help="tiered host cache size in %% of the ids (0 = off)")
    ap.add_argument("--admission", choices=("frequency", "lru"), default="frequency",
                    help="host cache admission of the tiered set-up (store.cache_admission)")
    ap.add_argument("--traffic-batches", type=int, default=0, metavar="WARM",
                    help="only count the tiered set-up's RocksDB rows per batch over 150 batches after WARM "
                         "(untimed, load-independent), then exit")
    add_device_arg(ap)
    args = ap.parse_args(argv)
    device = str(bench_device(args.device, ap))
    n_ids = 100_000 if args.tiny else 1_000_000 if args.quick else 10_000_000
    if args.traffic_batches:
        r = cache_traffic(n_ids, args.traffic_batches, 150, args.cache_pct, args.admission, device)
        print(f"tiered, {args.admission} admission, batches {r['warm_batches']}..{r['warm_batches'] + 150}: RocksDB "
              f"rows written {r['rocks_rows_written_per_batch']:.1f} / read {r['rocks_rows_read_per_batch']:.1f} per "
              f"batch (an ideal cache leaves {r['rocks_rows_per_batch_best_cache']:.1f}), cache hit rate "
              f"{r['cache_hit_rate']:.3f}")
        if args.json:
            print(json.dumps(r))
        return 0
    seconds = args.seconds or (0.5 if args.tiny else 7.0 if args.quick else 30.0)
    warm = 2 if args.tiny else 10 if args.quick else 50
    res = {s: _run_setup(s, n_ids, warm, seconds, args.cache_pct, args.admission, device)
           for s in ("memory", "rocks", "tiered")}
    a, b, c = res["memory"], res["rocks"], res["tiered"]
    summary = {
        "tiered_rows_per_s": round(c["rows_per_s"]),
        "memory_rows_per_s": round(a["rows_per_s"]),
        "rocks_rows_per_s": round(b["rows_per_s"]),
        "tiered_vs_memory": round(c["rows_per_s"] / a["rows_per_s"], 3),
        "tiered_vs_rocks": round(c["rows_per_s"] / b["rows_per_s"], 3),
        "hot_hit_rate": round(c["hot_hit_rate"], 4),
        "tiered_rss_vs_memory": round(c["peak_rss_mb"] / a["peak_rss_mb"], 3),
        "memory_peak_rss_mb": round(a["peak_rss_mb"], 1),
        "rocks_peak_rss_mb": round(b["peak_rss_mb"], 1),
        "tiered_peak_rss_mb": round(c["peak_rss_mb"], 1),
        # the table's own memory (peak RSS over the same process's RSS with the runtime loaded, no table yet)
        "tiered_table_mb_vs_memory": round(c["table_mb"] / a["table_mb"], 3),
        "memory_table_mb": round(a["table_mb"], 1),
        "tiered_table_mb": round(c["table_mb"], 1),
        "memory_runtime_mb": round(a["runtime_rss_mb"], 1),
        "tiered_runtime_mb": round(c["runtime_rss_mb"], 1),
        "admission": args.admission,
        "device": device,
        "ids": n_ids,
        "host_cache_rows": int(n_ids * args.cache_pct / 100),
        "cache_hit_rate": round(c.get("cache_hit_rate", 0.0), 4),
    }
    for name, r in (("rocks", b), ("tiered", c)):  # the I/O split, per timed batch
        summary[f"{name}_ms_per_batch"] = round(r["ms_per_batch"], 3)
        for k in ("rocks_rows_read", "rocks_rows_written", "rocks_read_s", "rocks_write_s"):
            summary[f"{name}_{k.replace('_s', '_ms')}_per_batch"] = round(r[k], 3 if k.endswith("_s") else 1)
    summary["memory_ms_per_batch"] = round(a["ms_per_batch"], 3)
    summary.update(traffic_bound(n_ids, n_ids // 100, summary["host_cache_rows"]))
    summary["tiered_vs_rocks_of_bound"] = round(summary["tiered_vs_rocks"] / summary["tiered_vs_rocks_traffic_bound"], 3)
    print(f"store benchmark: Zipf({ZIPF}) over {n_ids:,} ids, dim {DIM}, batch {BATCH}, "
          f"{seconds:.0f}s per set-up (each in its own process)")
    for name, r in res.items():
        extra = f", hot hit rate {r['hot_hit_rate']:.3f}" if "hot_hit_rate" in r else ""
        if "cache_hit_rate" in r:
            extra += f", host cache hit rate {r['cache_hit_rate']:.3f} ({r['cache_mb']:.0f} MB)"
        print(f"  {name:7s} {r['rows_per_s']:>12,.0f} rows/s  peak RSS {r['peak_rss_mb']:8.1f} MB{extra}")
    for name in ("rocks", "tiered"):
        print(f"  {name:7s} per batch: {summary[f'{name}_ms_per_batch']:.2f} ms, of which RocksDB reads "
              f"{summary[f'{name}_rocks_read_ms_per_batch']:.2f} ms ({summary[f'{name}_rocks_rows_read_per_batch']:.0f}"
              f" rows) and writes {summary[f'{name}_rocks_write_ms_per_batch']:.2f} ms "
              f"({summary[f'{name}_rocks_rows_written_per_batch']:.0f} rows); reads may run on the prefetch thread")
    print(f"  a batch has {summary['unique_rows_per_batch']:.0f} unique rows; with the hot tier and an ideal "
          f"{summary['host_cache_rows']:,}-row cache {summary['rocks_rows_per_batch_best_cache']:.0f} still go to "
          f"RocksDB: tiered/rocks <= {summary['tiered_vs_rocks_traffic_bound']:.2f} unless RocksDB time is hidden")
    print(f"  tiered/memory = {summary['tiered_vs_memory']:.3f} (goal >= 0.5)   "
          f"tiered/rocks = {summary['tiered_vs_rocks']:.2f}   "
          f"tiered RSS/memory RSS = {summary['tiered_rss_vs_memory']:.3f} (whole process)")
    print(f"  table data (peak RSS over the runtime's): tiered {summary['tiered_table_mb']:.0f} MB / memory "
          f"{summary['memory_table_mb']:.0f} MB = {summary['tiered_table_mb_vs_memory']:.3f} (goal <= 0.25); "
          f"runtime {summary['tiered_runtime_mb']:.0f} / {summary['memory_runtime_mb']:.0f} MB; "
          f"tiered/rocks of its traffic bound {summary['tiered_vs_rocks_of_bound']:.2f} (goal >= 0.8)")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
