"""What PERSIA-style stale sparse reads (``trainer.sparse_staleness = K``) could save a trainer group on the wire.

On a link-bound group the events/s is the link's bytes/s over the bytes each event puts on it; overlapping
communication with compute cannot beat the link, so staleness raises events/s there only by sending fewer
bytes per event. :func:`row_traffic` replays the event stream a group trains and counts, per step and rank,
the embedding rows the rank must fetch from OTHER ranks, in the bytes ``RowExchange.bytes_sent`` counts, with
no cache (K = 0, what the trainer sends now) and with a K-step cache of fetched rows per rank.

How the trace follows the group:

- **Events**: ``SyntheticStream(cfg).batches(events)`` (or the batches given). **Partitions**: the producer's
  own rule, reproduced exactly: each batch is cut into Arrow messages of ``kafka.events_per_message`` events
  and the messages go round-robin over the sorted partitions, the first to partition 1
  (``EventProducer._next_partition``). **Ranks**: the group's static assignment, rank r reads the partitions
  p with ``p % world == r`` (``trainer.group.assigned_partitions``), merged by event time, which for the
  synthetic stream is the produced order.
- **Windows and mini-batches**: each rank polls windows of ``batch_size * window_batches`` events (divided by
  the world under ``trainer.group_batch = "group"``) and plans them as the trainer does (``plan`` with the
  per-rank ``local_batch``: FAE hot and cold mini-batches under ``trainer.schedule = "fae"``, arrival order
  otherwise). A window's step count is the largest plan of any rank; a rank with fewer joins with empty
  steps, which age its cache all the same. Windows are always full (a topic produced ahead of training);
  refused steps and their retries are not modelled.
- **Hot rows**: in a group the hot set only shapes the plans; a hot row lives on its OWNER's device tier
  (``ShardedTrainerCore.apply_hot_set`` keeps the owned part) and is fetched through the exchange like any
  other row, so hot ids count as remote traffic here exactly as cold ones. The hot set is the
  ``hot_budget_rows(cfg.hot, cfg.model)`` most frequent ``(table, id)`` of the whole trace (an oracle stand-in for the
  sketch's choice), applied from the first step; with ``hot_set=False`` there is none and every window trains
  in arrival order, as a group does whose hot-set source never publishes (``bench cluster`` runs no sketch
  worker, so its groups train that way).
- **Bytes** (fp32 rows, as ``RowExchange`` counts what leaves a rank): a remote id costs ``4 * dim`` for its
  row (leaving the owner) and ``4 * dim`` for its gradient (leaving the requester), its id (4 bytes in a step
  where every rank's ids fit int32, else 8) and, with ``store.admit_min_count >= 2``, its 4-byte occurrence
  count; every rank sends the ``(W-1) * (F+2) * 4`` byte counts header each step (F tables). A rank's own rows
  cost nothing. Keys are tables: a table shared by several fields is one set of unique ids per step
  (``streamrec.model.unique_ids``).
- **The K-step cache**: a rank that fetched a row at step s reads that copy at steps s+1 .. s+K (at most K
  steps stale) and fetches again at its first use after that. Its gradients are summed locally and sent once
  when the entry expires (or when the trace ends), so each fetch costs one row in and one gradient out:
  rows, gradients, ids and occurrence counts all shrink by the cache's hit rate; the header does not.

``speedup_bound`` turns a saved fraction of the row bytes into the link-bound events/s ratio; ``link_terms``
gives the other bytes on the link (the dense all-reduce and Kafka). ``python -m streamrec.benchmarks.staleness
[--events N] [--world W] [--ks 0,1,2] [--hot-set] [--json]`` prints both for the bench cluster's config.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

_I32 = np.iinfo(np.int32)


def speedup_bound(row_bytes: float, dense_bytes: float, kafka_bytes: float, saved_fraction: float) -> float:
    """Link-bound events/s with ``saved_fraction`` of the row bytes gone, over the events/s without:
    ``(row + dense + kafka) / (row * (1 - saved) + dense + kafka)`` (all per event, in the same units)."""
    if not 0.0 <= saved_fraction <= 1.0:
        raise ValueError(f"saved_fraction must be in [0, 1], got {saved_fraction}")
    before = row_bytes + dense_bytes + kafka_bytes
    after = row_bytes * (1.0 - saved_fraction) + dense_bytes + kafka_bytes
    if before <= 0:
        raise ValueError("no bytes per event: the link bounds nothing")
    return float("inf") if after <= 0 else before / after


def config(events: int, overrides: dict | None = None):
    """The bench cluster's config (``benchmarks/bench_cluster.py``): 4 partitions, a 2,000-row hot set, the
    default model, ``events`` synthetic events; ``overrides`` on top."""
    from streamrec.app.config import load_config

    return load_config(None, {"kafka.partitions": 4, "hot.budget_rows": 2_000, "trainer.device": "cpu",
                              "generator.events": int(events), **(overrides or {})}, env={})


@dataclass
class _RankTrace:
    """One rank's remote reads: per group step, the keys (dense indices of distinct (table, id)) of the rows
    it reads from other ranks."""

    steps: list[np.ndarray]  # per group step: remote keys, each once
    key_owner: np.ndarray  # per key: its owner rank
    key_bytes: np.ndarray  # per key: one fp32 row's bytes (4 * its table's dim)


def _rank_of_events(batches: Sequence, cfg, world: int) -> np.ndarray:
    """Each event's rank: the producer's round-robin message partition, then the group's static assignment."""
    from streamrec.trainer.group import assigned_partitions

    parts = int(cfg.kafka.partitions)
    if parts < world:
        raise ValueError(f"a group of {world} ranks needs at least {world} partitions, the config has {parts}")
    to_rank = np.empty(parts, np.int64)
    for r in range(world):
        to_rank[assigned_partitions(parts, r, world)] = r
    per = int(cfg.kafka.events_per_message)
    out, m = [], 0
    for b in batches:
        msgs = -(-len(b) // per)
        msg_of = m + np.arange(len(b)) // per
        out.append(to_rank[(msg_of + 1) % parts])  # _next_partition advances before its first use
        m += msgs
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _hot_tables(batch, cfg) -> dict[str, np.ndarray]:
    """The trace's ``hot_budget_rows`` most frequent (table, id), per table (sorted ids)."""
    from streamrec.foundation import hot_budget_rows
    from streamrec.model import field_tables

    budget = int(hot_budget_rows(cfg.hot, cfg.model))
    ft = field_tables(cfg.model)
    keys, counts, tabs = [], [], []
    tables = list(cfg.model.tables)
    for ti, t in enumerate(tables):
        vals = [batch.sparse[f].values for f, tb in ft.items() if tb == t]
        if not vals:
            continue
        u, c = np.unique(np.concatenate(vals), return_counts=True)
        keys.append(u)
        counts.append(c)
        tabs.append(np.full(len(u), ti))
    if not keys or budget <= 0:
        return {}
    ids, cnt, tab = np.concatenate(keys), np.concatenate(counts), np.concatenate(tabs)
    top = np.argsort(-cnt, kind="stable")[:budget]
    return {t: np.sort(ids[top][tab[top] == ti]) for ti, t in enumerate(tables)}


def _trace(cfg, batches: list, world: int, hot_set: bool):
    """Every rank's remote reads per group step (:class:`_RankTrace`), whether each step's ids all fit int32,
    the per-rank batch and the number of tables."""
    from streamrec.foundation import EventBatch
    from streamrec.model import field_tables, unique_ids
    from streamrec.trainer import hot_samples, plan
    from streamrec.trainer.batch_sizes import batch_sizes
    from streamrec.trainer.sharding import owners_of_fields

    m, t = cfg.model, cfg.trainer
    fields = [f.name for f in m.fields]
    tables = list(m.tables)
    dims = np.array([int(m.tables[tb]) for tb in tables], np.int64)
    ft = field_tables(m)
    rank_of = _rank_of_events(batches, cfg, world)
    whole = EventBatch.concat(batches, m.dense_dim, fields)
    hot = _hot_tables(whole, cfg) if hot_set and t.schedule == "fae" else {}

    def hot_mask(f, ids):
        h = hot.get(ft.get(f, f))
        if h is None or not len(h):
            return np.zeros(len(ids), bool)
        at = np.minimum(np.searchsorted(h, ids), len(h) - 1)
        return h[at] == ids

    lb = batch_sizes(t, world).step
    window = max(1, t.batch_size * t.window_batches // (world if t.group_batch == "group" else 1))
    schedule = t.schedule if hot else "arrival"
    rank_events = [np.flatnonzero(rank_of == r) for r in range(world)]
    n_windows = max((-(-len(e) // window) for e in rank_events), default=0)
    # per rank, per group step: (table index, id) of every unique id, and whether the step's ids fit int32
    raw: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(world)]
    narrow: list[bool] = []
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for w in range(n_windows):
        plans = []
        for r in range(world):
            win = whole.take(rank_events[r][w * window:(w + 1) * window])
            is_hot = hot_samples(win, fields, hot_mask) if schedule == "fae" else np.zeros(len(win), bool)
            plans.append((win, plan(is_hot, lb, schedule, t.hot_per_cold)))
        for i in range(max(len(p) for _, p in plans)):
            fits = True
            for r, (win, mbs) in enumerate(plans):
                if i >= len(mbs):
                    raw[r].append(empty)
                    continue
                u = unique_ids(win.take(mbs[i].rows), m)
                ids = [np.asarray(u[tb][0], np.int64) if tb in u else np.zeros(0, np.int64) for tb in tables]
                tab = np.repeat(np.arange(len(tables)), [len(x) for x in ids])
                ids = np.concatenate(ids)
                fits = fits and (not len(ids) or (int(ids.min()) >= _I32.min and int(ids.max()) <= _I32.max))
                raw[r].append((tab, ids))
            narrow.append(fits)
    # per rank: the remote (table, id) of every step, numbered 0..U-1 over the whole trace
    out = []
    for r in range(world):
        steps = raw[r]
        tab = np.concatenate([s[0] for s in steps]) if steps else np.zeros(0, np.int64)
        ids = np.concatenate([s[1] for s in steps]) if steps else np.zeros(0, np.int64)
        owner = owners_of_fields(tables, ids, tab, world)
        remote = owner != r
        pair = np.stack([tab[remote], ids[remote]], 1)
        uniq, inverse = (np.unique(pair, axis=0, return_inverse=True) if len(pair)
                         else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64)))
        inverse = inverse.reshape(-1)
        step_of = np.repeat(np.arange(len(steps)), [len(s[1]) for s in steps])[remote]
        bounds = np.searchsorted(step_of, np.arange(len(steps) + 1))
        tr = _RankTrace([inverse[bounds[i]:bounds[i + 1]] for i in range(len(steps))],
                        owners_of_fields(tables, uniq[:, 1], uniq[:, 0], world), 4 * dims[uniq[:, 0]])
        out.append(tr)
    return out, np.array(narrow, bool), lb, len(tables)


def _fetches(tr: _RankTrace, narrow: np.ndarray, k: int) -> tuple[np.ndarray, int, int, int]:
    """With a ``k``-step cache: fetches per key, remote reads, id bytes (the fetches' ids), fetches in all."""
    n_keys = len(tr.key_owner)
    last = np.full(n_keys, -(1 << 40), np.int64)
    fetched = np.zeros(n_keys, np.int64)
    accesses = id_bytes = 0
    for s, keys in enumerate(tr.steps):
        if not len(keys):
            continue
        miss = keys[(s - last[keys]) > k]
        last[miss] = s
        fetched[miss] += 1
        accesses += len(keys)
        id_bytes += len(miss) * (4 if narrow[s] else 8)
    return fetched, accesses, id_bytes, int(fetched.sum())


def row_traffic(cfg, events: int, world: int, ks: Sequence[int] = (0, 1, 2, 4, 8, 16),
                batches: Iterable | None = None, hot_set: bool = True) -> dict:
    """Remote row traffic of a ``world``-rank group on ``events`` events of ``cfg``'s synthetic stream (or
    ``batches``, as a producer sends them), with no cache and with a K-step cache for each ``k`` in ``ks``;
    ``hot_set``: whether the group trains with a hot set (the module docstring's oracle) or without one.
    With ``batches`` given, ``events`` is not read.

    Figures per event are the group's: the sum over ranks of what leaves each rank, over the events trained.
    ``k0`` holds the no-cache figures in ``RowExchange.bytes_sent``'s terms (``exchange_bytes_per_event`` is the
    group's summed ``bytes_sent`` per event); ``by_k`` per K: ``row_bytes_per_event`` (rows out + gradients
    back), ``saved_fraction`` of the K=0 row bytes, ``hit_rate`` (remote reads served by the cache),
    ``exchange_bytes_per_event`` and ``exchange_saved_fraction`` (with ids, counts and the header)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if any(int(k) < 0 for k in ks):
        raise ValueError(f"staleness must be >= 0 steps, got {list(ks)}")
    from streamrec.ingest import SyntheticStream

    src = list(batches) if batches is not None else list(SyntheticStream(cfg).batches(int(events)))
    n_events = sum(len(b) for b in src)
    if not n_events:
        raise ValueError("no events to trace")
    traces, narrow, lb, n_tables = _trace(cfg, src, world, hot_set)
    steps = len(narrow)
    header = world * steps * (world - 1) * (n_tables + 2) * 4
    occ = 4 if cfg.store.admit_min_count >= 2 else 0
    by_k = []
    for k in sorted({0, *(int(k) for k in ks)}):
        rows = ids = occ_b = fetches = accesses = 0
        per_rank = np.zeros(world)
        for r, tr in enumerate(traces):
            fetched, acc, idb, nf = _fetches(tr, narrow, k)
            out_grads = float((fetched * tr.key_bytes).sum())  # gradients leave this rank
            rows += 2 * out_grads
            per_rank[r] += out_grads + idb + nf * occ
            np.add.at(per_rank, tr.key_owner, fetched * tr.key_bytes)  # rows leave their owners
            ids += idb
            occ_b += nf * occ
            fetches += nf
            accesses += acc
        exch = rows + ids + occ_b + header
        by_k.append({"k": k, "row_bytes_per_event": rows / n_events, "exchange_bytes_per_event": exch / n_events,
                     "hit_rate": 1.0 - fetches / accesses if accesses else 0.0, "remote_reads": int(accesses),
                     "fetches": int(fetches),
                     "per_rank_bytes_per_event": [float(v + header / world) / n_events for v in per_rank]})
    base = by_k[0]
    for d in by_k:
        d["saved_fraction"] = 1.0 - d["row_bytes_per_event"] / base["row_bytes_per_event"] \
            if base["row_bytes_per_event"] else 0.0
        d["exchange_saved_fraction"] = 1.0 - d["exchange_bytes_per_event"] / base["exchange_bytes_per_event"] \
            if base["exchange_bytes_per_event"] else 0.0
    return {
        "events": n_events, "world": world, "hot_set": bool(hot_set), "local_batch": lb, "steps": steps,
        "partitions": int(cfg.kafka.partitions),
        "k0": {"row_bytes_per_event": base["row_bytes_per_event"],
               "exchange_bytes_per_event": base["exchange_bytes_per_event"],
               "header_bytes_per_event": header / n_events,
               "remote_reads_per_event": base["remote_reads"] / n_events},
        "by_k": [d for d in by_k if d["k"] in {int(k) for k in ks}] if ks else [],
    }


def link_terms(cfg, world: int, steps: int, events: int, batches: Sequence | None = None) -> dict:
    """The other bytes per event on a group's links: the dense all-reduce (a ring of the model's parameters
    and the step's ``world + 1`` flags at ``trainer.dense_allreduce_precision``, uncompressed, ``steps``
    times, summed over ranks) and the Kafka bytes (the events' Arrow messages)."""
    from streamrec.foundation import EventSchema
    from streamrec.ingest import SyntheticStream, encode_messages
    from streamrec.model import build_model
    from streamrec.trainer.dense_sync import ring_bytes

    params = sum(p.numel() for p in build_model(cfg.model).parameters())
    size = {"fp32": 4, "bf16": 2, "fp16": 2}[cfg.trainer.dense_allreduce_precision]
    dense = world * steps * ring_bytes(params + world + 1, size, world) / events
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    src = batches if batches is not None else SyntheticStream(cfg).batches(min(events, 20_000))
    total = n = 0
    for b in src:
        total += sum(len(x) for x in encode_messages(b, schema, "arrow", cfg.kafka.events_per_message))
        n += len(b)
    return {"dense_bytes_per_event": dense, "kafka_bytes_per_event": total / max(1, n), "dense_params": int(params)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=150_000)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ks", default="0,1,2,4,8,16", help="comma-separated staleness bounds in steps")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--hot-set", action="store_true",
                    help="train with the oracle hot set (FAE plans); default: none, as bench cluster's groups train")
    a = ap.parse_args(argv)
    cfg = config(a.events)
    res = row_traffic(cfg, a.events, a.world, [int(k) for k in a.ks.split(",")], hot_set=a.hot_set)
    link = link_terms(cfg, a.world, res["steps"], res["events"])
    res["link"] = link
    res["k0"]["collective_bytes_per_event"] = res["k0"]["exchange_bytes_per_event"] + link["dense_bytes_per_event"]
    for d in res["by_k"]:
        # the exchange's whole traffic: ids and counts shrink with the rows, the header stays
        d["speedup_bound"] = speedup_bound(res["k0"]["exchange_bytes_per_event"], link["dense_bytes_per_event"],
                                           link["kafka_bytes_per_event"], d["exchange_saved_fraction"])
    if a.json:
        print(json.dumps(res))
        return 0
    k0 = res["k0"]
    print(f"{res['events']:,} events, world {res['world']}, {'oracle hot set' if a.hot_set else 'no hot set'}, "
          f"{res['local_batch']} events per rank step, {res['steps']:,} steps")
    print(f"K=0: exchange {k0['exchange_bytes_per_event']:.1f} B/event (rows + gradients "
          f"{k0['row_bytes_per_event']:.1f}, header {k0['header_bytes_per_event']:.2f}), dense "
          f"{link['dense_bytes_per_event']:.1f}, collective {k0['collective_bytes_per_event']:.1f}, "
          f"kafka {link['kafka_bytes_per_event']:.1f}")
    print(f"{'K':>3} {'row B/ev':>10} {'saved':>7} {'hit':>7} {'exch B/ev':>10} {'bound':>7}")
    for d in res["by_k"]:
        print(f"{d['k']:>3} {d['row_bytes_per_event']:>10.1f} {d['saved_fraction']:>7.3f} {d['hit_rate']:>7.3f} "
              f"{d['exchange_bytes_per_event']:>10.1f} {d['speedup_bound']:>7.3f}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
