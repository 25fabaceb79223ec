"""``streamrec bench scale``: a trainer group of N ranks (``ShardedTrainerCore``, gloo on
127.0.0.1, one process per rank) against the plain 1-rank ``TrainerCore`` on the same stream.

The model is Criteo-like (26 sparse fields in Criteo's cardinality proportions, zipf 1.2,
``--ids`` ids in all, dim 16, 13 dense features, DLRM 13-64-16 / 367-64-32-1 by default),
global batch 512, mini-batches of ``512 // N`` events per rank, 8 steps per ``train_window``
call, no hot tier (arrival order), torch 1 thread per process. Every rank's store gets
``1/N`` of the host cache and block cache, so a group holds the memory one trainer does.
Events are generated once in the parent and handed to the ranks as a file.

Set-ups, each a core with its own store; the set-ups of one process set run interleaved
window by window (window i of each, back to back, each starting on all ranks together), so
a burst of load from elsewhere on a shared machine hits all of them alike:

  n1 (one process): ``plain``, the plain trainer over the whole stream in stream order (the
        baseline for AUC); ``sharded1``, a ``ShardedTrainerCore`` of world 1 (the sharded
        code path with no one to talk to); ``plain@256``/``plain@128``, the plain trainer at a
        rank's mini-batch size (what splitting the batch costs with no traffic at all)
  nN (N processes): ``ref``, the plain trainer over the whole stream on rank 0 alone while
        the other ranks wait in a barrier (the 1-rank CPU baseline, measured in the same
        minutes as the group); ``control``, N independent plain trainers side by side (what
        sharing the 2 cores costs); ``exact`` (N=2; N=4 too without ``--quick``): rank r
        trains events i with i % N == r, so the ranks' k-th mini-batches together are the
        single trainer's k-th; ``online``: a 4-partition topic in memory (messages of 256
        events round-robin to partitions 0..3), rank r reads partitions p % N == r in stream order;
        ``online:bf16`` / ``online:fp16``: the same with rows, row gradients and the dense
        all-reduce on the wire in bf16 / fp16 (``trainer.exchange_precision`` and
        ``trainer.dense_allreduce_precision``); ``exact:bf16`` / ``exact:fp16`` without ``--quick``
        (a mode ``online:<exchange>/<dense>``, e.g. ``online:fp16/fp32``, sets the two apart);
        ``rank``: ``trainer.group_batch = "rank"``, the online split with each rank training
        mini-batches of 512 (a group step of N x 512 events; 8 / N steps per rank window, so
        window i still covers the same 4,096 events of the stream); n1 adds ``plain@1024`` /
        ``plain@2048``, the plain trainer at the rank-mode group's global batch on the same stream
        order (at N=2 its step k holds the same 1,024 events as the group's step k), so the batch
        size's effect on AUC is told apart from the group's; ``online:bf16+powersgd`` (and
        ``rank:bf16+powersgd``): the bf16 wire with the dense all-reduce compressed by PowerSGD
        (``trainer.dense_allreduce_compression``, rank 4, the warm-up window's steps uncompressed)

Figures: |AUC_2 - AUC_1| (exact; progressive AUC, the group's via ``group_metrics``),
AUC_N - AUC_1 (online; at each wire precision, and against the fp32 group's AUC), collective
bytes per trained event (at each wire precision) (all ranks' all_to_all payload
plus their all_reduce buffers, over all events), CPU-seconds per event of the group's
training loops (sum over ranks of ``time.process_time`` around ``train_window``, after one
warm-up window) over ``ref``'s, and the training loop's wall-clock events/s. The machine
has 2 cores: N ranks share them, so wall-clock events/s is not a speed-up; CPU per event is
the work the group adds. A projection to 8-64 ranks is computed from the measured
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
PRECISIONS = ("bf16", "fp16")  # compressed wire formats measured beside fp32
COMPRESSED = ("bf16+powersgd",)  # + PowerSGD on the dense all-reduce (rank 4, the first window uncompressed)
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
    if mode in ("online", "rank"):  # messages round-robin over partitions; a rank reads partitions p % world == rank
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


class _Runner:
    """One set-up in a rank process: its core, its store and its windows (cut before any timing)."""

    def __init__(self, rank: int, world: int, mode: str, data, spec: dict):
        import torch

        from streamrec.embedding_store import EmbeddingStore
        from streamrec.foundation import hot_budget
        from streamrec.trainer import TrainerCore

        self.mode, self.rank = mode, rank
        mode, _, precision = ("plain" if mode == "ref" else mode).partition(":")
        self.sharded = mode in ("exact", "online", "sharded1", "rank")
        self.root = os.path.join(spec["root"], f"{mode}-{(precision or 'fp32').replace('/', '-')}-n{world}-r{rank}")
        cfg = scale_config(self.root, spec["ids"], spec["bottom"], spec["top"], world if self.sharded else 1)
        precision, _, compress = precision.partition("+")  # "<precision>+powersgd": PowerSGD on the dense sum
        if compress:  # rank 4; the untimed first window's steps are summed uncompressed (start_powerSGD_iter)
            cfg.trainer.dense_allreduce_compression, cfg.trainer.powersgd_rank = "powersgd", 4
            cfg.trainer.powersgd_start_iter = WINDOW_BATCHES // (world if mode == "rank" else 1)
        if precision:  # "p": one wire format for rows, row gradients and the dense all-reduce; "p/q": rows p, dense q
            sparse_p, _, dense_p = precision.partition("/")
            cfg.trainer.exchange_precision, cfg.trainer.dense_allreduce_precision = sparse_p, dense_p or sparse_p
        if mode.startswith("plain@"):  # the plain trainer at a group rank's mini-batch size: the split's floor
            cfg.trainer.batch_size = int(mode.partition("@")[2])
        if mode == "rank":  # per-rank batches: each rank trains BATCH events a step, the group N x BATCH
            cfg.trainer.group_batch = "rank"
        self.store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                                  torch.device("cpu"), path=os.path.join(self.root, "store"))
        if self.sharded:
            from streamrec.trainer.sharded_core import ShardedTrainerCore

            self.core = ShardedTrainerCore(cfg.model, cfg.trainer, self.store, torch.device("cpu"), rank, world,
                                           store_cfg=cfg.store, join=cfg.join)
            self.traffic = _Traffic(self.core.exchange)
        else:
            self.core = TrainerCore(cfg.model, cfg.trainer, self.store, torch.device("cpu"),
                                    store_cfg=cfg.store, join=cfg.join)
        # every set-up cuts the stream into the same number of windows (one window = 4096 events of the
        # group, 8 of its steps), so window i of every set-up covers the same stretch of the stream
        w = world if mode in ("exact", "online", "control", "rank") else 1
        size = BATCH * WINDOW_BATCHES // w
        self.windows = windows_of(local_stream(data, w, rank, mode), size)
        if self.sharded:  # train_window is a collective: a rank with fewer windows joins as an idle rank
            most = max(-(-len(local_stream(data, w, r, mode)) // size) for r in range(w))
            self.windows += [None] * (most - len(self.windows))
        self.cpu_w: list[float] = []  # per timed window: CPU seconds, wall seconds, events
        self.wall_w: list[float] = []
        self.ev_w: list[int] = []

    def train(self, i: int, timed: bool) -> None:
        if i >= len(self.windows):
            return
        w = self.windows[i]
        c0, t0 = time.process_time(), time.perf_counter()
        self.core.train_window(w)
        if i == 0 and self.sharded:  # the bytes of the warm-up window (PowerSGD's uncompressed steps among them)
            self.bytes_w0 = (self.core.dense_bytes_sent, self.core.exchange.bytes_sent)
        if timed:
            self.cpu_w.append(time.process_time() - c0)
            self.wall_w.append(time.perf_counter() - t0)
            self.ev_w.append(len(w) if w is not None else 0)

    def result(self) -> dict:
        core = self.core
        m = core.group_metrics() if self.sharded else core.metrics
        out = {"mode": self.mode, "rank": self.rank, "events": core.events, "timed_events": sum(self.ev_w),
               "cpu_s": sum(self.cpu_w), "wall_s": sum(self.wall_w), "cpu_windows": self.cpu_w,
               "event_windows": self.ev_w, "auc": m.auc, "logloss": m.logloss, "rejected": core.rejected_events,
               "params": sum(p.numel() for p in core.model.parameters())}
        if self.sharded:
            ex, t = core.exchange, self.traffic
            out.update(steps=core.steps, exchange_bytes=ex.bytes_sent, dense_bytes=core.dense_bytes_sent,
                       dense_fp32_retries=core.dense_fp32_retries,
                       dense_bytes_timed=core.dense_bytes_sent - self.bytes_w0[0],
                       exchange_bytes_timed=ex.bytes_sent - self.bytes_w0[1],
                       ids_bytes=t.ids, rows_bytes=t.rows, grads_bytes=t.grads,
                       counts_bytes=ex.bytes_sent - t.ids - t.rows - t.grads,
                       remote_ids=t.remote_ids, local_uniques=t.local_uniques)
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)
        return out


def _train(rank: int, world: int, data, spec: dict) -> list[dict]:
    """Every set-up of ``spec['modes']`` in this rank, interleaved window by window: window i of each
    set-up runs back to back, so a burst of load from elsewhere on the machine hits all of them alike.
    ``ref`` (the plain trainer over the whole stream) runs on rank 0 alone while the other ranks wait
    (blocked in a barrier, which costs no CPU): the 1-rank baseline, measured in the same minutes."""
    import torch.distributed as dist

    runners = [None if m == "ref" and rank != 0 else _Runner(rank, world, m, data, spec) for m in spec["modes"]]
    n = max(len(r.windows) for r in runners if r is not None)
    for i in range(n):  # window 0 is the warm-up: allocations, first RocksDB files; trained and scored, not timed
        for r in runners:
            if world > 1:
                dist.barrier()  # a set-up's window starts on every rank together, after the last one ended
            if r is not None:
                r.train(i, timed=i > 0)
    return [r.result() if r is not None else None for r in runners]


def _rank_main(rank: int, world: int, port: int, spec: dict, q) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with open(spec["data"], "rb") as f:
            data = pickle.load(f)
        q.put((rank, _train(rank, world, data, spec)))
    except BaseException:  # report, do not hang the parent
        q.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def run_group(world: int, spec: dict, timeout: float) -> list[list[dict]]:
    """``spec['modes']`` in ``world`` spawned ranks; per rank, one result per mode."""
    import torch.multiprocessing as mp

    from streamrec.ingest import free_port

    port = free_port()
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
    # robust to bursts of load from elsewhere on a shared machine: the median window (all ranks' CPU for it)
    k = min(len(r["cpu_windows"]) for r in ranks)
    per_w = [sum(r["cpu_windows"][i] for r in ranks) / max(1, sum(r["event_windows"][i] for r in ranks))
             for i in range(k) if sum(r["event_windows"][i] for r in ranks)]
    out["cpu_per_event_us_median"] = 1e6 * float(np.median(per_w)) if per_w else float("nan")
    out["events_per_s"] = timed / out["wall_s"] if timed else float("nan")
    if steps:
        tot = {k: sum(r[k] for r in ranks) for k in ("exchange_bytes", "dense_bytes", "ids_bytes", "rows_bytes",
                                                     "grads_bytes", "counts_bytes", "remote_ids", "local_uniques")}
        out.update(steps=steps, dense_fp32_retries=ranks[0].get("dense_fp32_retries", 0), **tot)
        out["bytes_per_event"] = (tot["exchange_bytes"] + tot["dense_bytes"]) / ev
        timed_b = sum(r["exchange_bytes_timed"] + r["dense_bytes_timed"] for r in ranks)
        out["bytes_per_event_timed"] = timed_b / timed if timed else float("nan")  # after the warm-up window
        out["dense_bytes_per_event_timed"] = sum(r["dense_bytes_timed"] for r in ranks) / timed if timed else float("nan")
        out["bytes_per_step"] = (tot["exchange_bytes"] + tot["dense_bytes"]) / steps
        out["dense_bytes_per_event"] = tot["dense_bytes"] / ev
        out["sparse_bytes_per_event"] = tot["exchange_bytes"] / ev
        out["remote_ids_per_step"] = tot["remote_ids"] / steps
        out["local_uniques_per_step"] = tot["local_uniques"] / steps
        out["dense_bytes_per_rank_step"] = ranks[0]["dense_bytes"] / steps
    return out


def uniques_profile(batch, fields, worlds) -> dict[int, dict]:
    """Per world size: the mean over global steps of the ranks' summed unique ids per local mini-batch
    (each rank's, all fields) and how many of them another rank owns (``owner_of``), on the exact split."""
    from streamrec.trainer.sharding import owner_of

    steps = min(64, len(batch) // BATCH)
    n = steps * BATCH
    out = {}
    for w in worlds:
        uniq = remote = 0
        for f in fields:
            j = batch.sparse[f]
            vals = j.values[:j.offsets[n]]
            event = np.repeat(np.arange(n), np.diff(j.offsets[:n + 1]))
            rank = (event % BATCH) % w  # the exact split: event i of a step goes to rank i % w
            group = (event // BATCH) * w + rank  # one (step, rank) mini-batch
            order = np.lexsort((vals, group))
            g, v = group[order], vals[order]
            first = np.ones(len(v), bool)
            first[1:] = (g[1:] != g[:-1]) | (v[1:] != v[:-1])
            uniq += int(first.sum())
            remote += int((owner_of(f, v[first], w) != g[first] % w).sum())
        out[w] = {"uniques_per_step": uniq / steps, "remote_per_step": remote / steps}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer events (under 3 minutes on 2 cores)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke run (two windows of events, 20k ids, world 2): checks the bench works, its figures "
                        "mean little")
    p.add_argument("--events", type=int, help="events in the stream (rounded up to whole 4096-event windows)")
    p.add_argument("--ids", type=int, default=500_000, help="ids over all 26 fields (default 500,000)")
    p.add_argument("--bottom", default="64,16", help="bottom MLP widths (default 64,16; the last is the dim 16)")
    p.add_argument("--top", default="64,32", help="top MLP widths (default 64,32)")
    p.add_argument("--worlds", default="2,4", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from streamrec.foundation import EventBatch
    from streamrec.ingest import SyntheticStream

    win = BATCH * WINDOW_BATCHES
    events = args.events or (2 * win if args.tiny else 40_960 if args.quick else 196_608)
    if args.tiny:  # quick's set-ups, world 2 only; two windows: PowerSGD's first one runs uncompressed
        args.ids, args.worlds, args.quick = 20_000, "2", True
    events = -(-events // win) * win
    bottom = [int(x) for x in args.bottom.split(",")]
    top = [int(x) for x in args.top.split(",")]
    worlds = [int(x) for x in args.worlds.split(",")]
    load0 = os.getloadavg()[0]  # another job on the box shows up here (and in every CPU figure)
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
        big = [f"plain@{BATCH * w}" for w in worlds]  # the rank-mode group's global batch, one trainer
        n1, s1, *n1_rest = run_group(1, {**spec, "modes": ["plain", "sharded1", *small, *big]}, timeout)[0]
        n1_small, n1_big = n1_rest[:len(worlds)], n1_rest[len(worlds):]
        base, sh1 = group_figures([n1]), group_figures([s1])
        small_cpu = {w: group_figures([r])["cpu_per_event_us"] for w, r in zip(worlds, n1_small)}
        big_runs = {w: group_figures([r]) for w, r in zip(worlds, n1_big)}
        us = base["cpu_per_event_us"]
        print(f"n1 plain TrainerCore: auc {base['auc']:.4f}  {base['events_per_s']:,.0f} events/s  {us:.1f} us CPU/event"
              f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
        print(f"   same process, interleaved window by window: sharded core of world 1 (its code path, no traffic) "
              f"{sh1['cpu_per_event_us']:.1f} us/event ({sh1['cpu_per_event_us'] / us:.2f}x, auc {sh1['auc']:.4f}); "
              + ", ".join(f"plain at a rank's mini-batch {BATCH // w}: {small_cpu[w]:.1f} us/event "
                          f"({small_cpu[w] / us:.2f}x)" for w in worlds), flush=True)
        print("   one trainer at the rank-mode groups' global batch: " + ", ".join(
            f"plain@{BATCH * w}: auc {g['auc']:.4f} ({g['auc'] - base['auc']:+.5f} vs batch {BATCH}), "
            f"{g['cpu_per_event_us']:.1f} us/event ({g['cpu_per_event_us'] / us:.2f}x)" for w, g in big_runs.items()),
            flush=True)
        runs: dict[str, dict] = {}
        for w in worlds:
            t0 = time.perf_counter()
            modes = ["ref", "control", "exact", "online"] if w == 2 or not args.quick else ["ref", "control", "online"]
            modes += [f"online:{p}" for p in PRECISIONS] + ([] if args.quick else [f"exact:{p}" for p in PRECISIONS])
            modes += ["rank"]  # trainer.group_batch = "rank": 512 events per rank step
            # PowerSGD's set-ups; in rank mode with its wire uncompressed beside it (online has online:bf16)
            modes += [f"online:{p}" for p in COMPRESSED] + ([f"rank:{q}" for p in COMPRESSED for q in (
                p.partition("+")[0], p)] if "rank" in modes else [])
            per_rank = run_group(w, {**spec, "modes": modes}, timeout)
            for i, mode in enumerate(modes):
                runs[f"{mode}_n{w}"] = group_figures([r[i] for r in per_rank if r[i] is not None])
            ref, ctl = runs[f"ref_n{w}"], runs[f"control_n{w}"]
            print(f"n{w} (ranks as processes on the 2 cores; each set-up's window i back to back):", flush=True)
            print(f"   ref: the plain trainer on rank 0 alone, the others waiting: {ref['cpu_per_event_us']:.1f} us "
                  f"CPU/event ({ref['cpu_per_event_us'] / us:.2f}x the n1 run's); control: {w} independent plain "
                  f"trainers side by side, 1/{w} of the stream each: {ctl['cpu_per_event_us']:.1f} us/event "
                  f"({ctl['cpu_per_event_us'] / ref['cpu_per_event_us']:.2f}x ref: what sharing the cores costs), "
                  f"{ctl['events_per_s']:,.0f} events/s together", flush=True)
            for mode in modes[2:]:
                g = runs[f"{mode}_n{w}"]
                ev = g["events"]
                print(f"   {mode:>6}: auc {g['auc']:.4f} (diff {g['auc'] - base['auc']:+.5f})  {g['bytes_per_event']:,.0f} "
                      f"B/event = dense all-reduce {g['dense_bytes_per_event']:,.0f} + sparse "
                      f"{g['sparse_bytes_per_event']:,.0f} (ids {g['ids_bytes'] / ev:.0f}, rows {g['rows_bytes'] / ev:.0f}, "
                      f"grads {g['grads_bytes'] / ev:.0f}, counts {g['counts_bytes'] / ev:.1f}); "
                      f"{g['bytes_per_step'] / 1024:,.1f} KiB/step, {g['remote_ids_per_step']:,.0f} remote ids/step; "
                      f"CPU {g['cpu_per_event_us']:.1f} us/event = {g['cpu_per_event_us'] / ref['cpu_per_event_us']:.2f}x "
                      f"ref (median window {g['cpu_per_event_us_median'] / ref['cpu_per_event_us_median']:.2f}x; "
                      f"{g['cpu_per_event_us'] / us:.2f}x the n1 run's); {g['events_per_s']:,.0f} events/s", flush=True)
            for p in PRECISIONS:
                g, f32 = runs[f"online:{p}_n{w}"], runs[f"online_n{w}"]
                print(f"   online {p}: {g['bytes_per_event'] / f32['bytes_per_event']:.3f}x fp32's bytes; AUC "
                      f"{g['auc'] - f32['auc']:+.5f} against the fp32 group's, logloss {g['logloss'] - f32['logloss']:+.5f}"
                      f"; {g['dense_fp32_retries']} dense sums redone in fp32", flush=True)
            g, bg = runs[f"rank_n{w}"], big_runs[w]
            print(f"   rank (group_batch=rank, {BATCH} per rank, global {BATCH * w}): CPU "
                  f"{g['cpu_per_event_us'] / ref['cpu_per_event_us']:.2f}x ref (median window "
                  f"{g['cpu_per_event_us_median'] / ref['cpu_per_event_us_median']:.2f}x), {g['bytes_per_event']:,.0f} "
                  f"B/event, {g['events_per_s']:,.0f} events/s; AUC {g['auc'] - base['auc']:+.5f} vs one trainer at "
                  f"{BATCH}, {g['auc'] - bg['auc']:+.5f} vs one trainer at {BATCH * w} (the batch size alone: "
                  f"{bg['auc'] - base['auc']:+.5f})", flush=True)
            for m in (f"{k}:{p}" for p in COMPRESSED for k in ("online", "rank")):  # PowerSGD's set-ups
                if f"{m}_n{w}" not in runs:
                    continue
                g, f32, same = runs[f"{m}_n{w}"], runs[f"{m.partition(':')[0]}_n{w}"], runs.get(f"{m.partition('+')[0]}_n{w}")
                print(f"   {m}: {g['bytes_per_event']:,.0f} B/event ({g['bytes_per_event_timed']:,.0f} after the "
                      f"uncompressed warm-up window; dense {g['dense_bytes_per_event_timed']:,.0f}); AUC "
                      f"{g['auc'] - f32['auc']:+.5f} against its fp32 group's"
                      + (f", {g['auc'] - same['auc']:+.5f} against the same wire uncompressed" if same else "")
                      + f"; CPU {g['cpu_per_event_us'] / f32['cpu_per_event_us']:.2f}x its fp32 group's", flush=True)
            print(f"   [{time.perf_counter() - t0:.0f}s for n{w}]", flush=True)

        params = n1["params"]
        dim = cfg.model.embedding_dim
        from streamrec.trainer.sharding import wire_bytes_per_row

        id_b = 4 if int(max(int(data.sparse[f].values.max(initial=0)) for f in fields)) < 2 ** 31 else 8  # int32 ids
        per_id = {p: id_b + 2 * wire_bytes_per_row(p, dim) for p in ("fp32",) + PRECISIONS}  # id, row, gradient
        prof = uniques_profile(data, fields, PROJECT_WORLDS)
        proj = []
        for w in PROJECT_WORLDS:
            row = {"world": w, "events_per_rank_step": BATCH / w, "remote_ids_per_step": prof[w]["remote_per_step"],
                   "uniques_per_step": prof[w]["uniques_per_step"]}
            counts = w * (w - 1) * (len(fields) + 2) * 4 if w > 1 else 0
            for p in ("fp32",) + PRECISIONS:
                ring = 2 * (w - 1) * (params + w + 1) * (4 if p == "fp32" else 2) if w > 1 else 0  # a ring all-reduce
                sparse = per_id[p] * prof[w]["remote_per_step"] + counts
                sfx = "" if p == "fp32" else f"_{p}"
                row.update({f"bytes_per_event{sfx}": (ring + sparse) / BATCH, f"sparse_bytes_per_event{sfx}": sparse / BATCH,
                            f"dense_bytes_per_event{sfx}": ring / BATCH})
            # a rank sends 1/w of the group's bytes and trains 1/w of its events: it sends bytes_per_event per
            # event it trains, so its NIC caps it at nic / bytes_per_event events/s (the group at w x that)
            for nic in NICS_GBIT:
                for sfx in ("", "_bf16"):
                    row[f"rank_events_per_s_{nic}g{sfx}"] = (nic * 1e9 / 8) / row[f"bytes_per_event{sfx}"] if w > 1 else None
            proj.append(row)
        print(f"dense parameters {params:,} ({params * 4 / 1024:,.1f} KiB fp32 all-reduced per step); B per remote unique "
              f"id (id {id_b} + row + gradient): " + ", ".join(f"{p} {b}" for p, b in per_id.items()))
        print("projection at global batch 512 (measured unique ids per local mini-batch of this stream; a ring "
              "all-reduce's wire bytes; fp32 | bf16):")
        print(f"  {'N':>3} {'ev/rank/step':>12} {'remote ids/step':>15} {'B/event':>15} {'dense':>13} {'sparse':>11}"
              f"  events/s a rank can train before its NIC is full at " + " / ".join(f"{n} Gbit" for n in NICS_GBIT)
              + " (fp32 | bf16)")
        for r in proj:
            nic = " / ".join(f"{r[f'rank_events_per_s_{n}g']:,.0f}" for n in NICS_GBIT) if r["world"] > 1 else "-"
            nic16 = " / ".join(f"{r[f'rank_events_per_s_{n}g_bf16']:,.0f}" for n in NICS_GBIT) if r["world"] > 1 else "-"
            print(f"  {r['world']:>3} {r['events_per_rank_step']:>12.0f} {r['remote_ids_per_step']:>15,.0f} "
                  f"{r['bytes_per_event']:>7,.0f} | {r['bytes_per_event_bf16']:>5,.0f} "
                  f"{r['dense_bytes_per_event']:>6,.0f} | {r['dense_bytes_per_event_bf16']:>4,.0f} "
                  f"{r['sparse_bytes_per_event']:>5,.0f} | {r['sparse_bytes_per_event_bf16']:>3,.0f}  {nic} | {nic16}")

        summary = {"events": events, "world_sizes": [1] + worlds, "ids": args.ids, "batch": BATCH,
                   "window_batches": WINDOW_BATCHES, "dense_params": params,
                   "auc_n1": base["auc"], "logloss_n1": base["logloss"],
                   "events_per_s_n1": base["events_per_s"], "cpu_per_event_us_n1": us,
                   "cpu_sharded_n1_vs_plain": sh1["cpu_per_event_us"] / us, "auc_sharded_n1": sh1["auc"]}
        for w in worlds:
            ref = runs[f"ref_n{w}"]
            r_us, r_med = ref["cpu_per_event_us"], ref["cpu_per_event_us_median"]
            summary[f"cpu_small_batch_n{w}"] = small_cpu[w] / us
            summary[f"cpu_contention_n{w}"] = runs[f"control_n{w}"]["cpu_per_event_us"] / r_us
            summary[f"control_events_per_s_n{w}"] = runs[f"control_n{w}"]["events_per_s"]
            summary[f"ref_cpu_per_event_us_n{w}"] = r_us
            for p in PRECISIONS:  # compressed wire formats: bytes and AUC, against the fp32 group's
                g, f32 = runs[f"online:{p}_n{w}"], runs[f"online_n{w}"]
                ev = g["events"]
                summary.update({f"bytes_per_event_n{w}_{p}": g["bytes_per_event"],
                                f"dense_bytes_per_event_n{w}_{p}": g["dense_bytes_per_event"],
                                f"sparse_bytes_per_event_n{w}_{p}": g["sparse_bytes_per_event"],
                                f"ids_bytes_per_event_n{w}_{p}": g["ids_bytes"] / ev,
                                f"rows_bytes_per_event_n{w}_{p}": g["rows_bytes"] / ev,
                                f"grads_bytes_per_event_n{w}_{p}": g["grads_bytes"] / ev,
                                f"online_dauc_n{w}_{p}": g["auc"] - base["auc"],
                                f"dauc_vs_fp32_n{w}_{p}": g["auc"] - f32["auc"],
                                f"dlogloss_vs_fp32_n{w}_{p}": g["logloss"] - f32["logloss"],
                                f"dense_fp32_retries_n{w}_{p}": g["dense_fp32_retries"],
                                f"cpu_inflation_n{w}_{p}": g["cpu_per_event_us"] / r_us})
                ex = runs.get(f"exact:{p}_n{w}")
                if ex is not None:
                    summary[f"exact_dauc_n{w}_{p}"] = abs(ex["auc"] - base["auc"])
            g, bg = runs[f"rank_n{w}"], big_runs[w]  # group_batch = "rank": per-rank batch BATCH, global N x BATCH
            summary.update({f"cpu_inflation_n{w}_rank_batch": g["cpu_per_event_us"] / r_us,
                            f"cpu_inflation_median_n{w}_rank_batch": g["cpu_per_event_us_median"] / r_med,
                            f"cpu_per_event_us_n{w}_rank_batch": g["cpu_per_event_us"],
                            f"bytes_per_event_n{w}_rank_batch": g["bytes_per_event"],
                            f"dense_bytes_per_event_n{w}_rank_batch": g["dense_bytes_per_event"],
                            f"sparse_bytes_per_event_n{w}_rank_batch": g["sparse_bytes_per_event"],
                            f"events_per_s_n{w}_rank_batch": g["events_per_s"], f"steps_n{w}_rank_batch": g["steps"],
                            f"auc_n{w}_rank_batch": g["auc"], f"dauc_n{w}_rank_batch": g["auc"] - base["auc"],
                            f"dauc_vs_big_batch_n{w}_rank_batch": g["auc"] - bg["auc"],
                            f"auc_plain_batch{BATCH * w}": bg["auc"],
                            f"dauc_plain_batch{BATCH * w}_vs_{BATCH}": bg["auc"] - base["auc"],
                            f"cpu_plain_batch{BATCH * w}_vs_{BATCH}": bg["cpu_per_event_us"] / us})
            for m in (f"{k}:{p}" for p in COMPRESSED for k in ("online", "rank")):  # PowerSGD on the dense sum
                g = runs.get(f"{m}_n{w}")
                if g is None:
                    continue
                f32, same = runs[f"{m.partition(':')[0]}_n{w}"], runs.get(f"{m.partition('+')[0]}_n{w}")
                tag = m.replace(":", "_").replace("+", "_")  # e.g. online_bf16_powersgd
                summary.update({f"bytes_per_event_n{w}_{tag}": g["bytes_per_event"],
                                f"bytes_per_event_timed_n{w}_{tag}": g["bytes_per_event_timed"],
                                f"dense_bytes_per_event_n{w}_{tag}": g["dense_bytes_per_event"],
                                f"dense_bytes_per_event_timed_n{w}_{tag}": g["dense_bytes_per_event_timed"],
                                f"sparse_bytes_per_event_n{w}_{tag}": g["sparse_bytes_per_event"],
                                f"dauc_vs_fp32_n{w}_{tag}": g["auc"] - f32["auc"],
                                f"dlogloss_vs_fp32_n{w}_{tag}": g["logloss"] - f32["logloss"],
                                f"online_dauc_n{w}_{tag}": g["auc"] - base["auc"],
                                f"cpu_vs_fp32_n{w}_{tag}": g["cpu_per_event_us"] / f32["cpu_per_event_us"],
                                f"cpu_inflation_n{w}_{tag}": g["cpu_per_event_us"] / r_us})
                if same is not None:
                    summary[f"dauc_vs_uncompressed_n{w}_{tag}"] = g["auc"] - same["auc"]
            for mode in ("exact", "online"):
                g = runs.get(f"{mode}_n{w}")
                if g is None:
                    continue
                tag = f"n{w}" if mode == "online" else f"exact_n{w}"
                summary.update({f"auc_{mode}_n{w}": g["auc"], f"cpu_inflation_{tag}": g["cpu_per_event_us"] / r_us,
                                f"cpu_inflation_median_{tag}": g["cpu_per_event_us_median"] / r_med,
                                f"cpu_inflation_vs_n1_run_{tag}": g["cpu_per_event_us"] / us,
                                f"cpu_per_event_us_{tag}": g["cpu_per_event_us"]})
                if mode == "exact":
                    summary[f"exact_dauc_n{w}"] = abs(g["auc"] - base["auc"])
                    summary[f"exact_dlogloss_n{w}"] = abs(g["logloss"] - base["logloss"])
                    continue
                ev = g["events"]
                summary.update({f"online_dauc_n{w}": g["auc"] - base["auc"],
                                f"bytes_per_event_n{w}": g["bytes_per_event"], f"bytes_per_step_n{w}": g["bytes_per_step"],
                                f"dense_bytes_per_event_n{w}": g["dense_bytes_per_event"],
                                f"sparse_bytes_per_event_n{w}": g["sparse_bytes_per_event"],
                                f"ids_bytes_per_event_n{w}": g["ids_bytes"] / ev,
                                f"rows_bytes_per_event_n{w}": g["rows_bytes"] / ev,
                                f"grads_bytes_per_event_n{w}": g["grads_bytes"] / ev,
                                f"remote_ids_per_step_n{w}": g["remote_ids_per_step"],
                                f"events_per_s_n{w}": g["events_per_s"], f"steps_n{w}": g["steps"]})
        if "exact_dauc_n2" in summary:
            summary["exact_dauc"] = summary["exact_dauc_n2"]
        goals = []
        if "exact_dauc" in summary:
            goals.append(f"exact |dAUC| n2 {summary['exact_dauc']:.5f} (goal <= 0.001)")
        if "online_dauc_n2" in summary:
            goals.append(f"online dAUC n2 {summary['online_dauc_n2']:+.5f} (goal >= -0.002)")
        for w, g_b, g_c in ((2, 200, 1.35), (4, 300, 1.6)):
            if f"bytes_per_event_n{w}" in summary:
                goals.append(f"n{w} {summary[f'bytes_per_event_n{w}']:,.0f} B/event (goal <= {g_b}), CPU "
                             f"{summary[f'cpu_inflation_n{w}']:.2f}x (goal <= {g_c}; small-batch floor "
                             f"{summary[f'cpu_small_batch_n{w}']:.2f}x)")
            for p in PRECISIONS:
                if f"bytes_per_event_n{w}_{p}" in summary:
                    goals.append(f"n{w} {p} {summary[f'bytes_per_event_n{w}_{p}']:,.0f} B/event (AUC "
                                 f"{summary[f'dauc_vs_fp32_n{w}_{p}']:+.5f} vs fp32)")
        for w in worlds:
            if f"cpu_inflation_n{w}_rank_batch" in summary:
                goals.append(f"n{w} group_batch=rank: CPU {summary[f'cpu_inflation_n{w}_rank_batch']:.2f}x, "
                             f"{summary[f'bytes_per_event_n{w}_rank_batch']:,.0f} B/event, AUC "
                             f"{summary[f'dauc_n{w}_rank_batch']:+.5f} vs batch {BATCH}, "
                             f"{summary[f'dauc_vs_big_batch_n{w}_rank_batch']:+.5f} vs batch {BATCH * w}")
        for w in worlds:
            for k in ("online", "rank"):
                for p in COMPRESSED:
                    tag = f"{k}_{p.replace('+', '_')}"
                    if f"bytes_per_event_n{w}_{tag}" in summary:
                        goals.append(f"n{w} {k}:{p} {summary[f'bytes_per_event_n{w}_{tag}']:,.0f} B/event "
                                     f"({summary[f'bytes_per_event_timed_n{w}_{tag}']:,.0f} after warm-up; AUC "
                                     f"{summary[f'dauc_vs_fp32_n{w}_{tag}']:+.5f} vs fp32)")
        if "online_dauc_n4" in summary:
            goals.append(f"online dAUC n4 {summary['online_dauc_n4']:+.5f}")
        print("ratios: " + "; ".join(goals))
        summary["projection"] = proj
        summary["loadavg_1m_start_end"] = [load0, os.getloadavg()[0]]
        if args.json:
            print(json.dumps(summary))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
