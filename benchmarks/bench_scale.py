"""``streamrec bench scale``: a trainer group of N ranks (``ShardedTrainerCore``, gloo on
127.0.0.1, one process per rank) against the plain 1-rank ``TrainerCore`` on the same stream.

The model is Criteo-like (26 sparse fields in Criteo's cardinality proportions, zipf 1.2,
``--ids`` ids in all, dim 16, 13 dense features, DLRM 13-64-16 / 367-64-32-1 by default),
global batch 512, mini-batches of ``512 // N`` events per rank, 8 mini-batches per
``train_window`` call, no hot tier (arrival order), torch 1 thread per process. Every
store gets ``1/N`` of the host cache and block cache, so a group holds the memory one
trainer does. Events are generated once in the parent and handed to the ranks as a file.

Runs, all in one invocation, each in its own spawned processes:

  n1:        the plain ``TrainerCore`` over the whole stream in stream order (the baseline);
             then, in the same process, a ``ShardedTrainerCore`` of world 1 (the sharded code
             path with no one to talk to: its own overhead, without any traffic)
  n2 exact:  rank r trains the events i with i % 2 == r, so the ranks' k-th mini-batches
             together are the single trainer's k-th mini-batch (the group must match it)
  n2, n4 online: a 4-partition topic simulated in memory (messages of 256 events assigned
             round-robin to partitions 0..3), rank r reads the partitions p with p % N == r
             in stream order, as a group consumer would

Figures: |AUC_2 - AUC_1| (exact; progressive AUC, the group's via ``group_metrics``),
AUC_N - AUC_1 (online), collective bytes per trained event (all ranks' all_to_all payload
plus the all_reduce buffer, per event), CPU-seconds per event of the group's training loops
(sum over ranks of ``time.process_time`` around ``train_window``, after one warm-up window)
over the plain trainer's, and the training loop's wall-clock events/s. The machine has 2
cores: N ranks share them, so wall-clock events/s is not a speed-up measure; CPU per event
is the work the group adds. A projection to 8-64 ranks is computed from the measured
per-unique-id and per-step costs and the stream's unique ids per local mini-batch.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

BATCH = 512  # the group's (global) batch
WINDOW_BATCHES = 8  # mini-batches per train_window call
MESSAGE = 256  # events per simulated Kafka message
PARTITIONS = 4
PROJECT_WORLDS = (1, 2, 4, 8, 16, 32, 64)
NICS_GBIT = (10, 25, 100)


def scale_config(root: str, ids: int, bottom: list[int], top: list[int], world: int = 1):
    """The bench's config; a rank of ``world`` gets ``1/world`` of the host cache and block cache."""
    from streamrec.benchmarks.bench_train import bench_config

    cfg = bench_config(root, ids, BATCH, "scale", {
        "model.bottom_mlp": list(bottom), "model.top_mlp": list(top),
        "hot.budget_rows": 0, "trainer.schedule": "arrival", "trainer.window_batches": WINDOW_BATCHES,
    })
    cfg.store.host_cache_rows = cfg.store.host_cache_rows // world
    cfg.store.block_cache_mb = max(8, cfg.store.block_cache_mb // world)
    return cfg


def local_stream(batch, world: int, rank: int, mode: str):
    """Rank ``rank``'s events of the whole stream ``batch``, in the order it trains them."""
    idx = np.arange(len(batch))
    if mode.startswith("plain") or mode == "sharded1":
        return batch
    if mode == "control":  # independent plain trainers side by side: a contiguous 1/world of the stream each
        n = len(batch) // world
        return batch.take(idx[rank * n:(rank + 1) * n])
    if mode == "exact":  # the ranks' k-th mini-batches together are one trainer's k-th mini-batch
        return batch.take(idx[idx % world == rank])
    if mode == "online":  # messages round-robin over partitions; a rank reads partitions p % world == rank
        part = (idx // MESSAGE) % PARTITIONS
        return batch.take(idx[part % world == rank])
    raise ValueError(mode)


def windows_of(batch, size: int) -> list:
    return [batch.take(np.arange(s, min(len(batch), s + size))) for s in range(0, len(batch), size)]


class _Traffic:
    """Splits ``RowExchange.bytes_sent`` into ids, rows and row gradients (wraps ``_a2a`` on the instance)."""

    def __init__(self, exchange):
        self.ids = self.rows = self.grads = 0
        self.remote_ids = 0
        self.local_uniques = 0
        self._in_give_back = False
        a2a, give_back = exchange._a2a, exchange.give_back
        rank = exchange.rank

        def counted_a2a(send, recv_rows, send_rows):
            before = exchange.bytes_sent
            out = a2a(send, recv_rows, send_rows)
            n = exchange.bytes_sent - before
            if send.dtype.is_floating_point:
                if self._in_give_back:
                    self.grads += n
                else:
                    self.rows += n
            else:
                self.ids += n
                self.remote_ids += sum(send_rows) - send_rows[rank]
                self.local_uniques += sum(send_rows)
            return out

        def counted_give_back(grads):
            self._in_give_back = True
            try:
                return give_back(grads)
            finally:
                self._in_give_back = False

        exchange._a2a, exchange.give_back = counted_a2a, counted_give_back


def _train(rank: int, world: int, mode: str, data, spec: dict) -> dict:
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.trainer import TrainerCore

    root = os.path.join(spec["root"], f"{mode}-n{world}-r{rank}")
    sharded = not (mode.startswith("plain") or mode == "control")
    cfg = scale_config(root, spec["ids"], spec["bottom"], spec["top"], world if sharded else 1)
    local_batch = max(1, BATCH // world) if sharded else BATCH
    if mode.startswith("plain@"):  # the plain trainer at a group rank's mini-batch size: the split's floor
        local_batch = cfg.trainer.batch_size = int(mode.partition("@")[2])
    store = EmbeddingStore.from_config(cfg, torch.device("cpu"), path=os.path.join(root, "store"))
    if sharded:
        from streamrec.trainer.sharded_core import ShardedTrainerCore

        core = ShardedTrainerCore(cfg, store, torch.device("cpu"), rank, world)
        traffic = _Traffic(core.exchange)
    else:
        core = TrainerCore(cfg, store, torch.device("cpu"))
    params = sum(p.numel() for p in core.model.parameters())
    local = local_stream(data, world, rank, mode)
    wins = windows_of(local, local_batch * WINDOW_BATCHES)  # cut before timing: data is not the loop's work
    core.train_window(wins[0])  # warm-up: allocations, first RocksDB files; trained and scored, not timed
    import torch.distributed as dist

    dist.barrier()  # every rank (or side-by-side trainer) starts its timed loop together
    cpu, timed = 0.0, 0
    t0 = time.perf_counter()
    for w in wins[1:]:
        c0 = time.process_time()
        core.train_window(w)
        cpu += time.process_time() - c0
        timed += len(w)
    wall = time.perf_counter() - t0
    m = core.group_metrics() if sharded else core.metrics
    out = {"mode": mode, "rank": rank, "world": world, "events": core.events, "timed_events": timed,
           "cpu_s": cpu, "wall_s": wall, "auc": m.auc, "logloss": m.logloss, "params": params,
           "rejected": core.rejected_events}
    if sharded:
        ex = core.exchange
        out.update(steps=core.steps, exchange_bytes=ex.bytes_sent, dense_bytes=core.dense_bytes_sent,
                   ids_bytes=traffic.ids, rows_bytes=traffic.rows, grads_bytes=traffic.grads,
                   counts_bytes=ex.bytes_sent - traffic.ids - traffic.rows - traffic.grads,
                   remote_ids=traffic.remote_ids, local_uniques=traffic.local_uniques)
    store.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def _rank_main(rank: int, world: int, port: int, spec: dict, q) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with open(spec["data"], "rb") as f:
            data = pickle.load(f)
        q.put((rank, [_train(rank, world, mode, data, spec) for mode in spec["modes"]]))
    except BaseException:  # report, do not hang the parent
        q.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def run_group(world: int, spec: dict, timeout: float) -> list[list[dict]]:
    """``spec['modes']`` in ``world`` spawned ranks; per rank, one result per mode."""
    import socket

    import torch.multiprocessing as mp

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_rank_main, args=(r, world, port, spec, q)) for r in range(world)]
    for p in ps:
        p.start()
    out = {}
    try:
        for _ in ps:
            r, v = q.get(timeout=timeout)
            if isinstance(v, str):
                raise RuntimeError(f"rank {r} of {world} failed:\n{v}")
            out[r] = v
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]


def group_figures(ranks: list[dict]) -> dict:
    """One group run's totals over its ranks."""
    ev = sum(r["events"] for r in ranks)
    timed = sum(r["timed_events"] for r in ranks)
    steps = ranks[0].get("steps", 0)
    out = {"auc": ranks[0]["auc"], "logloss": ranks[0]["logloss"], "events": ev, "timed_events": timed,
           "cpu_s": sum(r["cpu_s"] for r in ranks), "wall_s": max(r["wall_s"] for r in ranks),
           "rejected": sum(r["rejected"] for r in ranks)}
    out["cpu_per_event_us"] = 1e6 * out["cpu_s"] / timed if timed else float("nan")
    out["events_per_s"] = timed / out["wall_s"] if timed else float("nan")
    if steps:
        tot = {k: sum(r[k] for r in ranks) for k in ("exchange_bytes", "dense_bytes", "ids_bytes", "rows_bytes",
                                                     "grads_bytes", "counts_bytes", "remote_ids", "local_uniques")}
        out.update(steps=steps, **tot)
        out["bytes_per_event"] = (tot["exchange_bytes"] + tot["dense_bytes"]) / ev
        out["bytes_per_step"] = (tot["exchange_bytes"] + tot["dense_bytes"]) / steps
        out["dense_bytes_per_event"] = tot["dense_bytes"] / ev
        out["sparse_bytes_per_event"] = tot["exchange_bytes"] / ev
        out["remote_ids_per_step"] = tot["remote_ids"] / steps
        out["local_uniques_per_step"] = tot["local_uniques"] / steps
        out["dense_bytes_per_rank_step"] = ranks[0]["dense_bytes"] / steps
    return out


def uniques_profile(batch, fields, worlds) -> dict[int, dict]:
    """Per world size: the mean over global steps of the ranks' summed unique ids per local mini-batch
    (each rank's, all fields) and how many of them another rank owns (``owner_of``)."""
    from streamrec.trainer.sharding import owner_of

    out = {}
    steps = min(64, len(batch) // BATCH)
    for w in worlds:
        lb = max(1, BATCH // w)
        uniq = remote = 0
        for k in range(steps):
            g = np.arange(k * BATCH, (k + 1) * BATCH)
            for r in range(w):
                rows = g[r::w][:lb]  # the exact split: ranks' mini-batches together are the global one
                for f in fields:
                    u = np.unique(batch.sparse[f].take(rows).values)
                    uniq += len(u)
                    remote += int((owner_of(f, u, w) != r).sum())
        out[w] = {"uniques_per_step": uniq / steps, "remote_per_step": remote / steps}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer events (under 3 minutes on 2 cores)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--events", type=int, help="events in the stream (rounded up to whole 4096-event windows)")
    p.add_argument("--ids", type=int, default=500_000, help="ids over all 26 fields (default 500,000)")
    p.add_argument("--bottom", default="64,16", help="bottom MLP widths (default 64,16; the last is the dim 16)")
    p.add_argument("--top", default="64,32", help="top MLP widths (default 64,32)")
    p.add_argument("--worlds", default="2,4", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from streamrec.foundation import EventBatch
    from streamrec.ingest import SyntheticStream

    win = BATCH * WINDOW_BATCHES
    events = args.events or (49_152 if args.quick else 196_608)
    events = -(-events // win) * win
    bottom = [int(x) for x in args.bottom.split(",")]
    top = [int(x) for x in args.top.split(",")]
    worlds = [int(x) for x in args.worlds.split(",")]
    root = tempfile.mkdtemp(prefix="bench-scale-")
    try:
        cfg = scale_config(root, args.ids, bottom, top)
        fields = cfg.model.field_names
        t0 = time.perf_counter()
        data = EventBatch.concat(list(SyntheticStream(cfg).batches(events)), cfg.model.dense_dim, fields)
        data = data.take(np.arange(events))
        path = os.path.join(root, "events.pkl")
        with open(path, "wb") as f:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
        gen_s = time.perf_counter() - t0
        spec = {"root": root, "data": path, "ids": args.ids, "bottom": bottom, "top": top}
        timeout = 900.0
        print(f"stream: {events:,} events, {len(fields)} fields, {args.ids:,} ids, dim {cfg.model.embedding_dim}, "
              f"DLRM {cfg.model.dense_dim}-{'-'.join(map(str, bottom))} / top {'-'.join(map(str, top))}-1, "
              f"global batch {BATCH}, {WINDOW_BATCHES} mini-batches per window (generated in {gen_s:.1f}s)", flush=True)

        t0 = time.perf_counter()
        small = [f"plain@{BATCH // w}" for w in worlds]
        n1, s1, *n1_small = run_group(1, {**spec, "modes": ["plain", "sharded1", *small]}, timeout)[0]
        base = group_figures([n1])
        sh1 = group_figures([s1])
        small_cpu = {w: group_figures([r])["cpu_per_event_us"] for w, r in zip(worlds, n1_small)}
        print(f"n1 plain TrainerCore: auc {base['auc']:.4f}  {base['events_per_s']:,.0f} events/s  "
              f"{base['cpu_per_event_us']:.1f} us CPU/event; sharded core of world 1: auc {sh1['auc']:.4f}, "
              f"{sh1['cpu_per_event_us']:.1f} us CPU/event ({sh1['cpu_per_event_us'] / base['cpu_per_event_us']:.2f}x)"
              f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
        print("n1 plain TrainerCore at a rank's mini-batch (no traffic, the split's own cost): " + ", ".join(
            f"batch {BATCH // w}: {small_cpu[w]:.1f} us CPU/event ({small_cpu[w] / base['cpu_per_event_us']:.2f}x)"
            for w in worlds), flush=True)
        runs: dict[str, dict] = {}
        for w in worlds:
            t0 = time.perf_counter()
            modes = ["control", "exact", "online"] if w == 2 else ["control", "online"]
            per_rank = run_group(w, {**spec, "modes": modes}, timeout)
            for i, mode in enumerate(modes):
                g = group_figures([r[i] for r in per_rank])
                runs[f"{mode}_n{w}"] = g
                if mode == "control":
                    print(f"n{w} control: {w} independent plain trainers side by side (a 1/{w} of the stream each): "
                          f"{g['cpu_per_event_us']:.1f} us CPU/event ({g['cpu_per_event_us'] / base['cpu_per_event_us']:.2f}x "
                          f"n1 alone: what sharing the machine costs)  {g['events_per_s']:,.0f} events/s together",
                          flush=True)
                    continue
                print(f"n{w} {mode:>6}: auc {g['auc']:.4f} (n1 {base['auc']:.4f}, diff {g['auc'] - base['auc']:+.5f})  "
                      f"{g['bytes_per_event']:,.0f} B/event (dense all-reduce {g['dense_bytes_per_event']:,.0f}, "
                      f"sparse {g['sparse_bytes_per_event']:,.0f}: ids {g['ids_bytes'] / g['events']:.0f}, rows "
                      f"{g['rows_bytes'] / g['events']:.0f}, grads {g['grads_bytes'] / g['events']:.0f}, counts "
                      f"{g['counts_bytes'] / g['events']:.1f})  {g['bytes_per_step'] / 1024:,.1f} KiB/step, "
                      f"{g['remote_ids_per_step']:,.0f} remote ids/step  CPU {g['cpu_per_event_us']:.1f} us/event "
                      f"({g['cpu_per_event_us'] / base['cpu_per_event_us']:.2f}x n1)  {g['events_per_s']:,.0f} "
                      f"events/s", flush=True)
            print(f"  [{time.perf_counter() - t0:.0f}s for n{w}]", flush=True)

        params = n1["params"]
        dim = cfg.model.embedding_dim
        per_remote_id = 8 + 2 * 4 * dim  # the id out, its row back, its gradient out again
        prof = uniques_profile(data, fields, PROJECT_WORLDS)
        proj = []
        for w in PROJECT_WORLDS:
            counts = w * (w - 1) * (len(fields) + 1) * 8 if w > 1 else 0
            dense = w * ((params + w + 1) * 4) if w > 1 else 0  # this code's count: the buffer, on every rank
            ring = 2 * (w - 1) * (params + w + 1) * 4 if w > 1 else 0  # a ring all-reduce's wire bytes
            sparse = per_remote_id * prof[w]["remote_per_step"] + counts
            row = {"world": w, "events_per_rank_step": BATCH / w, "remote_ids_per_step": prof[w]["remote_per_step"],
                   "uniques_per_step": prof[w]["uniques_per_step"],
                   "bytes_per_event": (dense + sparse) / BATCH, "sparse_bytes_per_event": sparse / BATCH,
                   "dense_bytes_per_event": dense / BATCH, "ring_bytes_per_event": (ring + sparse) / BATCH}
            # each rank sends 1/w of the group's bytes: a rank's NIC caps the GROUP at nic / (bytes/event / w)
            for nic in NICS_GBIT:
                row[f"group_events_per_s_{nic}g"] = (nic * 1e9 / 8) * w / row["ring_bytes_per_event"] if w > 1 else None
            proj.append(row)
        print(f"dense parameters {params:,} ({params * 4 / 1024:,.1f} KiB all-reduced per step on every rank); "
              f"{per_remote_id} B per remote unique id (id 8 + row {4 * dim} + gradient {4 * dim})")
        print("projection at global batch 512 (measured unique ids per local mini-batch of this stream):")
        print(f"  {'N':>3} {'ev/rank/step':>12} {'remote ids/step':>15} {'B/event':>9} {'dense':>8} {'sparse':>7} "
              f"{'ring B/event':>12}  group events/s a rank's NIC allows at " + " / ".join(f"{n} Gbit" for n in NICS_GBIT))
        for r in proj:
            nic = " / ".join(f"{r[f'group_events_per_s_{n}g']:,.0f}" for n in NICS_GBIT) if r["world"] > 1 else "-"
            print(f"  {r['world']:>3} {r['events_per_rank_step']:>12.0f} {r['remote_ids_per_step']:>15,.0f} "
                  f"{r['bytes_per_event']:>9,.0f} {r['dense_bytes_per_event']:>8,.0f} {r['sparse_bytes_per_event']:>7,.0f} "
                  f"{r['ring_bytes_per_event']:>12,.0f}  {nic}")

        e2, o2 = runs.get("exact_n2"), runs.get("online_n2")
        o4 = runs.get("online_n4")
        summary = {"events": events, "world_sizes": [1] + worlds, "ids": args.ids, "batch": BATCH,
                   "window_batches": WINDOW_BATCHES, "dense_params": params,
                   "auc_n1": base["auc"], "logloss_n1": base["logloss"],
                   "events_per_s_n1": base["events_per_s"], "cpu_per_event_us_n1": base["cpu_per_event_us"],
                   "cpu_sharded_n1_vs_plain": sh1["cpu_per_event_us"] / base["cpu_per_event_us"],
                   "auc_sharded_n1": sh1["auc"]}
        if e2:
            summary.update(exact_dauc=abs(e2["auc"] - base["auc"]), auc_exact_n2=e2["auc"],
                           exact_dlogloss=abs(e2["logloss"] - base["logloss"]))
        for w in worlds:
            g = runs[f"online_n{w}"]
            summary.update({f"auc_online_n{w}": g["auc"], f"online_dauc_n{w}": g["auc"] - base["auc"],
                            f"bytes_per_event_n{w}": g["bytes_per_event"], f"bytes_per_step_n{w}": g["bytes_per_step"],
                            f"dense_bytes_per_event_n{w}": g["dense_bytes_per_event"],
                            f"sparse_bytes_per_event_n{w}": g["sparse_bytes_per_event"],
                            f"ids_bytes_per_event_n{w}": g["ids_bytes"] / g["events"],
                            f"rows_bytes_per_event_n{w}": g["rows_bytes"] / g["events"],
                            f"grads_bytes_per_event_n{w}": g["grads_bytes"] / g["events"],
                            f"remote_ids_per_step_n{w}": g["remote_ids_per_step"],
                            f"cpu_inflation_n{w}": g["cpu_per_event_us"] / base["cpu_per_event_us"],
                            f"cpu_per_event_us_n{w}": g["cpu_per_event_us"],
                            f"cpu_small_batch_n{w}": small_cpu[w] / base["cpu_per_event_us"],
                            f"cpu_contention_n{w}": runs[f"control_n{w}"]["cpu_per_event_us"] / base["cpu_per_event_us"],
                            f"cpu_inflation_vs_control_n{w}": g["cpu_per_event_us"] / runs[f"control_n{w}"]["cpu_per_event_us"],
                            f"control_events_per_s_n{w}": runs[f"control_n{w}"]["events_per_s"],
                            f"events_per_s_n{w}": g["events_per_s"], f"steps_n{w}": g["steps"]})
        summary["projection"] = proj
        goals = []
        if e2:
            goals.append(f"exact |dAUC| {summary['exact_dauc']:.5f} (goal <= 0.001)")
        if o2:
            goals.append(f"online dAUC n2 {summary['online_dauc_n2']:+.5f} (goal >= -0.002)")
        for w, g_b, g_c in ((2, 200, 1.35), (4, 300, 1.6)):
            if f"bytes_per_event_n{w}" in summary:
                goals.append(f"n{w} {summary[f'bytes_per_event_n{w}']:,.0f} B/event (goal <= {g_b}), CPU "
                             f"{summary[f'cpu_inflation_n{w}']:.2f}x (goal <= {g_c}; "
                             f"{summary[f'cpu_inflation_vs_control_n{w}']:.2f}x {w} side-by-side plain trainers)")
        if o4:
            goals.append(f"online dAUC n4 {summary['online_dauc_n4']:+.5f}")
        print("ratios: " + "; ".join(goals))
        if args.json:
            print(json.dumps(summary))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
