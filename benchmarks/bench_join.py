"""``streamrec bench join``: the delayed-feedback joiner's speed, what waiting for labels costs in quality,
freshness from impression to served model, and the joiner's state per impression.

Throughput, on the embedded broker (or ``--bootstrap``), all in one run:

- ``join_events_per_s``: one ``streamrec join`` worker process (``join.mode = fake_negative``: every
  impression writes an example at once, so the output count is known in advance from the pure join) on a
  backlog of impressions and actions (``DelayedStream``, 4 co-partitioned partitions, keyed by
  ``request_id``, produced by confluent-kafka); input records (impressions + actions) over the span between
  the first and the last example's Kafka timestamp (the worker's start-up and group join excluded; the
  first batch's records counted in a span that does not hold them: optimistic by one batch in hundreds).
- ``raw_consume_events_per_s``: a bare confluent-kafka consumer reading both input topics' values (the
  ceiling), records over the summed read time.
- ``train_json_events_per_s``: one ``streamrec train`` process on a JSON events backlog, as ``bench e2e``
  measures it (``bench_e2e.train_together``: its rate over a window after a warm-up).
- ``join_2_workers_events_per_s``: ``streamrec join --workers 2`` (one group: each worker joins its own
  partitions) on the same backlog, into an output topic of its own, measured as the one worker is; the
  span starts at the first example, so a rebalance after it (the second worker joining the group late)
  counts against it. ``join_scaling_2_workers`` = two workers' rate over one's, both measured in the same
  run (goal >= 1.8 on a 2-core machine: the workers share nothing but the broker).
- ``join_vs_train_json`` (goal >= 2 with one worker per core: the joiner is never the pipeline's
  bottleneck): the two workers' rate (one worker's on a 1-core machine: the bench runs at most two) over
  the JSON trainer's, which uses every core; ``join_vs_train_json_workers`` says which;
  ``join_vs_train_json_one_worker`` and ``join_vs_raw`` (one worker over the bare consumer).

Quality, in-process (no broker): the delayed stream (clicks after a lognormal delay, some after the window,
drift in what users like) in event-time order through the pure join (:class:`~streamrec.joiner.JoinState`,
the worker's own rules) in both modes; a ``TrainerCore`` trained on the examples as the join emits them.
Every impression is scored once, when it arrives (the model it would be served by), against its TRUE
label from the generator's truth: ``auc_oracle`` (trained on the true label at impression time: the bound
nobody has), ``auc_window``, ``auc_fake_negative`` (``trainer.fake_negative_correction`` on) and
``auc_fake_negative_naive`` (off), each with its ``logloss_*``; ``auc_gap_best = auc_oracle -
max(auc_window, auc_fake_negative)`` (goal <= 0.005); ``calibration_*`` = mean prediction / true positive
rate (goal for the corrected fake-negative model: 0.95-1.05). The gap has two parts, told apart by
``auc_oracle_delayed``: a model given every negative at once with its true label and every click when the
click happens (an oracle for what no label can give sooner). ``auc_gap_label_delay = auc_oracle -
auc_oracle_delayed`` is what waiting for clicks costs on a drifting stream: no join closes it.
``auc_gap_fake_negative_vs_delayed = auc_oracle_delayed - auc_fake_negative`` is what the fake-negative mode
and its correction add to that wait (goal <= 0.005).

Freshness from impression to served model, a model of two measured parts: per example, its label delay
in the join (event time from the impression's ``ts`` to the record that made the join emit it: the action
for a positive, the action that closed the window for a window-mode negative, the impression itself for a
fake negative), plus the trainer's and serving's freshness (``bench_freshness.measure_freshness``, as
``bench e2e`` measures it: event in Kafka -> served model learned it, real processes). Each quantile is the
sum of the two parts' quantiles (exact when a long label delay comes with a long pipeline delay; for
independent delays it overstates p99). ``freshness_p50_s_window``, ``freshness_p99_s_window``,
``freshness_p50_s_fake_negative``, ``freshness_p99_s_fake_negative``.

Restart: ``restart_s`` = seconds from the start of a ``streamrec join`` worker killed with SIGKILL to it
joining again (the examples of new impressions on the events topic), with ``restart_state_impressions``
impressions of state behind it (100k; 2k at ``--tiny``), measured by :mod:`.join_restart` (goal <= 5 s
with 100k); ``restart_read_ahead_partitions``: the partitions whose kept state the restarted worker read
while its group formed (its log says so per partition).

State: ``state_bytes_per_impression`` = the join's table bytes (keys + JSON values, as the worker writes
them to its RocksDB table and changelog; waiting actions and watermarks included) over the impressions it
holds (open, or closed and kept for dedupe until ``W + L + O`` has passed), sampled through the
window-mode run once the state is at its steady size; ``state_rows_max`` beside it. The rows held are
bounded by the impression rate times ``W + L + O``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from streamrec.foundation import stop_process

PARTITIONS = 4
GOAL_JOIN_X = 2.0
GOAL_SCALING_2 = 1.8  # two workers (each its own partitions) against one, on a 2-core machine
GOAL_GAP = 0.005
GOAL_CAL = (0.95, 1.05)
# the quality stream: 5 impressions per second of event time, a 10 min attribution window, clicks after a
# lognormal delay (median 30 s, sigma 1.5: about 2% after the window), so the stream spans several windows
QUALITY = {"generator.events_per_s": 5.0, "join.window_s": 600.0, "join.allowed_lateness_s": 60.0,
           "join.orphan_wait_s": 300.0}
DELAY_MEDIAN_S = 30.0
SIZES = {  # (impressions for quality, seeds, impressions for throughput, JSON events for the trainer, warm-up s,
    # training window s, freshness run s, freshness warm-up s)
    "full": (100_000, 2, 400_000, 1_200_000, 8.0, 30.0, 30.0, 15.0),
    "quick": (40_000, 1, 150_000, 600_000, 4.0, 10.0, 15.0, 10.0),
    "tiny": (3_000, 1, 6_000, 100_000, 0.3, 1.0, 2.0, 3.0),
}
RESTART_STATE = {"full": 100_000, "quick": 100_000, "tiny": 2_000}  # impressions of state behind a restart
GOAL_RESTART_S = 5.0
GOAL_RESTART_STATE = 100_000
MODES = ("oracle", "oracle_delayed", "window", "fake_negative", "fake_negative_naive")


def _quality_config(seed: int, mode: str, root: Path):
    from streamrec.app.config import load_config

    over = {"trainer.device": "cpu", "model.seed": seed, "store.path": str(root / f"store-{mode}-{seed}"), **QUALITY,
            "join.mode": "window" if mode in ("oracle", "oracle_delayed", "window") else "fake_negative"}
    cfg = load_config(None, over, env={})
    if hasattr(cfg.trainer, "fake_negative_correction"):
        cfg.trainer.fake_negative_correction = mode == "fake_negative"
    return cfg


def _timeline(imps: list[dict], acts: list[dict]) -> list[tuple[int, int, dict]]:
    """Impressions and actions in event-time order, an impression before an action of the same ms."""
    out = [(ev["ts"], 0, ev) for ev in imps] + [(a["ts"], 1, a) for a in acts]
    out.sort(key=lambda r: (r[0], r[1]))
    return out


def _progressive(cfg, mode: str, imps, acts, truth: dict[str, int], tmp: Path, state_samples: list | None) -> dict:
    """Train one model on ``mode``'s examples as they are emitted; score each impression when it arrives."""
    import torch

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import EventSchema, hot_budget
    from streamrec.joiner import Action, JoinRules, JoinState
    from streamrec.joiner.machine import encode_value
    from streamrec.trainer import TrainerCore

    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp / f"store-{mode}-{cfg.model.seed}"))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    rules = JoinRules.from_config(cfg.join)
    join = JoinState(rules)
    scores: list[np.ndarray] = []
    labels: list[int] = []
    delays: list[int] = []  # per example: ms from its impression's ts to the record that emitted it
    out_ev: list[dict] = []
    chunk = int(cfg.trainer.batch_size)
    tl = _timeline(imps, acts)
    imp_ts: dict[str, int] = {}
    waiting: dict[str, dict] = {}  # oracle_delayed: the clicked impressions whose click has not arrived yet
    for s in range(0, len(tl), chunk):
        part = tl[s:s + chunk]
        shown = [r[2] for r in part if r[1] == 0]
        if shown:  # served by the model as it is when they arrive, before anything of this chunk is trained
            scores.append(core.predict(schema.batch_from_events(
                [{**ev, "label": 0} for ev in shown]))[:, 0])
            labels += [truth[ev["request_id"]] for ev in shown]
        for ts, kind, rec in part:
            if kind == 0:
                rid = rec["request_id"]
                imp_ts[rid] = ts
                if mode == "oracle":
                    exs = [(rid, {**rec, "label": truth[rid]})]
                elif mode == "oracle_delayed":  # a negative at once; a click waits for its action
                    exs = [] if truth[rid] else [(rid, {**rec, "label": 0})]
                    if truth[rid]:
                        waiting[rid] = rec
                else:
                    exs = [(e.request_id, e.event) for e in join.impression(rid, ts, dict(rec))]
            elif mode == "oracle_delayed":
                shown_rec = waiting.pop(rec["request_id"], None) if rec["type"] == "click" else None
                exs = [(rec["request_id"], {**shown_rec, "label": 1})] if shown_rec is not None else []
            else:
                exs = [] if mode == "oracle" else [(e.request_id, e.event) for e in join.action(
                    Action(rec["request_id"], rec["ts"], rec["type"], rec.get("value")))]
            for rid, ev in exs:
                delays.append(ts - imp_ts[rid])
                out_ev.append(ev)
        if out_ev:  # each example's kind rides in its ``feedback`` field (the join sets it; oracle: none)
            core.feed(schema.batch_from_events(out_ev))
            out_ev = []
        if state_samples is not None and s % (chunk * 16) == 0 and join.wa is not None:
            held = sum(1 for k in join.store if k.startswith("i/"))
            size = sum(len(k) + len(encode_value(v)) for k, v in join.store.items())
            steady = join.wa - imps[0]["ts"] > 2 * rules.horizon_ms  # past the first two horizons: steady size
            state_samples.append((size, held, join.stats.rows, steady))
    core.flush()
    store.close()
    p = np.clip(np.concatenate(scores).astype(np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, np.float64)
    from streamrec.foundation import roc_auc

    return {"auc": float(roc_auc(y, p)), "logloss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
            "calibration": float(p.mean() / max(y.mean(), 1e-12)), "delays_ms": np.asarray(delays, np.float64),
            "examples": int(core.events), "stats": join.stats}


def quality(n: int, seeds: list[int]) -> dict:
    import torch

    from streamrec.joiner import DelayedStream

    torch.set_num_threads(1)
    per: dict[str, dict[str, list]] = {m: {"auc": [], "logloss": [], "calibration": []} for m in MODES}
    delays: dict[str, list[np.ndarray]] = {m: [] for m in ("window", "fake_negative")}
    state: list = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        for seed in seeds:
            cfg0 = _quality_config(seed, "oracle", Path(tmp))
            imps, acts, truth = DelayedStream(cfg0.model, cfg0.generator, seed=seed + 7,
                                              delay_median_s=DELAY_MEDIAN_S).generate(n)
            for f in cfg0.model.fields:
                f.expected_ids = max(1, len({ev["sparse"][f.name] for ev in imps}))
            line = []
            for mode in MODES:
                cfg = _quality_config(seed, mode, Path(tmp))
                for f, g in zip(cfg.model.fields, cfg0.model.fields):
                    f.expected_ids = g.expected_ids
                r = _progressive(cfg, mode, imps, acts, truth, Path(tmp),
                                 state if mode == "window" and seed == seeds[0] else None)
                for k in ("auc", "logloss", "calibration"):
                    per[mode][k].append(r[k])
                if mode in delays:
                    delays[mode].append(r["delays_ms"])
                line.append(f"{mode} {r['auc']:.5f}")
            print(f"quality seed {seed}: {n:,} impressions, {len(acts):,} actions, true click rate "
                  f"{np.mean(list(truth.values())):.3f}; AUC " + ", ".join(line), flush=True)
    out: dict = {}
    for mode in MODES:
        for k in ("auc", "logloss", "calibration"):
            out[f"{k}_{mode}"] = float(np.mean(per[mode][k]))
    out["auc_gap_best"] = out["auc_oracle"] - max(out["auc_window"], out["auc_fake_negative"])
    # the gap's two parts: the wait for a click itself (no join closes it), and what each mode adds to the wait
    out["auc_gap_label_delay"] = out["auc_oracle"] - out["auc_oracle_delayed"]
    out["auc_gap_fake_negative_vs_delayed"] = out["auc_oracle_delayed"] - out["auc_fake_negative"]
    for mode, ds in delays.items():
        d = np.concatenate(ds) / 1000.0
        out[f"label_delay_p50_s_{mode}"] = float(np.percentile(d, 50))
        out[f"label_delay_p99_s_{mode}"] = float(np.percentile(d, 99))
    # the samples at the steady size; a stream shorter than two dedupe horizons has none: every sample then
    steady = [x[:3] for x in state if x[3]] or [x[:3] for x in state]
    size, held, rows = np.array(steady, dtype=np.float64).reshape(-1, 3).T
    out["state_bytes_per_impression"] = float(size.sum() / held.sum()) if held.sum() else None
    out["state_rows_max"] = int(rows.max()) if len(rows) else 0
    out["state_steady"] = any(x[3] for x in state)
    out.update(quality_impressions=n, seeds=seeds, quality_seconds=round(time.perf_counter() - t0, 1),
               per_seed={m: per[m]["auc"] for m in MODES})
    return out


# -- throughput ------------------------------------------------------------------------------------------
def _partition(rid: str) -> int:
    return zlib.crc32(rid.encode()) % PARTITIONS


def _produce_keyed(bootstrap: str, topic: str, rows: list[dict]) -> None:
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                     "queue.buffering.max.messages": 1_000_000, "log_level": 3})
    for r in rows:
        v = json.dumps(r, separators=(",", ":")).encode()
        while True:
            try:
                p.produce(topic, v, key=r["request_id"].encode(), partition=_partition(r["request_id"]))
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise RuntimeError(f"confluent-kafka could not deliver every record to {topic}")


def _expected_examples(cfg, imps, acts) -> int:
    """How many examples the join writes for this backlog (per partition, the pure join)."""
    from streamrec.joiner import Action, JoinRules, JoinState

    rules = JoinRules.from_config(cfg.join)
    n = 0
    for p in range(PARTITIONS):
        js = JoinState(rules)
        for ev in imps:
            if _partition(ev["request_id"]) == p:
                n += len(js.impression(ev["request_id"], ev["ts"], ev))
        for a in acts:
            if _partition(a["request_id"]) == p:
                n += len(js.action(Action(a["request_id"], a["ts"], a["type"])))
    return n


def _count_examples(bootstrap: str, topic: str, want: int, proc, log: Path, timeout_s: float) -> tuple[int, float]:
    """Read the events topic until ``want`` examples; (count, seconds between the first and last record ts)."""
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-join-out-{os.getpid()}", "log_level": 3,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got, first, last = 0, None, None
    deadline = time.monotonic() + timeout_s
    try:
        while got < want:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the joiner wrote {got:,} of {want:,} examples (exit {proc.poll()}); log {log}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            for m in c.consume(10_000, timeout=0.5):
                if m.error() is not None:
                    continue
                ts = m.timestamp()[1]
                first = ts if first is None else min(first, ts)
                last = ts if last is None else max(last, ts)
                got += 1
    finally:
        c.close()
    return got, (last - first) / 1000.0


def worker_config(bootstrap: str, name: str, suffix: str, state_dir: Path, **over):
    """A fake_negative joiner's config on fresh JSON topics named after ``name`` and ``suffix`` (created,
    ``PARTITIONS`` each); ``over`` adds settings."""
    from streamrec.app.config import load_config
    from streamrec.ingest import TopicSpec, ensure_topics

    cfg = load_config(None, {
        "kafka.partitions": PARTITIONS, "kafka.codec": "json",
        "kafka.events_topic": f"{name}-out-{suffix}", "kafka.dlq_topic": f"{name}-out-{suffix}.dlq",
        "join.impressions_topic": f"{name}-imp-{suffix}", "join.actions_topic": f"{name}-act-{suffix}",
        "join.group": f"bench-{name}-{suffix}", "join.mode": "fake_negative", "join.state_dir": str(state_dir),
        "generator.events_per_s": 50.0, **over}, env={})
    ensure_topics(bootstrap, [TopicSpec(t, PARTITIONS) for t in (cfg.join.impressions_topic, cfg.join.actions_topic,
                                                                 cfg.kafka.events_topic, cfg.kafka.dlq_topic)])
    return cfg


def _join_run(bootstrap: str, cfg, state_dir: Path, workers: int, want: int) -> tuple[int, float]:
    """``streamrec join --workers N`` (one group on the backlog, the partitions split among them) until the
    events topic holds ``want`` examples; (examples, seconds between the first and last example's ts)."""
    import tomli_w

    from . import bench_e2e

    conf = state_dir.with_suffix(".toml")
    conf.write_text(tomli_w.dumps(cfg.to_dict()))
    log = state_dir.with_suffix(".log")
    proc = subprocess.Popen([bench_e2e.STREAMREC, "join", "--config", str(conf), "--bootstrap", bootstrap,
                             "--workers", str(workers), "--stop-grace-s", "20"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        return _count_examples(bootstrap, cfg.kafka.events_topic, want, proc, log, 600.0)
    finally:
        stop_process(proc, 30)


def throughput(bootstrap: str, size: str, root: Path) -> dict:
    from streamrec.ingest import TopicSpec, ensure_topics
    from streamrec.joiner import DelayedStream

    from . import bench_e2e

    _, _, n_imp, n_json, warmup_s, window_s, _, _ = SIZES[size]
    suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    cfg = worker_config(bootstrap, "join", suffix, root / "join")
    imps, acts, _ = DelayedStream(cfg.model, cfg.generator, seed=11).generate(n_imp)
    want = _expected_examples(cfg, imps, acts)
    _produce_keyed(bootstrap, cfg.join.impressions_topic, imps)
    _produce_keyed(bootstrap, cfg.join.actions_topic, acts)
    n_in = len(imps) + len(acts)
    r: dict = {"join_impressions": len(imps), "join_actions": len(acts), "join_examples": want}
    print(f"join bench: {len(imps):,} impressions + {len(acts):,} actions, {PARTITIONS} partitions; "
          f"the join writes {want:,} examples (fake_negative)", flush=True)
    t_imp = n_imp / bench_e2e.raw_consume(bootstrap, cfg.join.impressions_topic, len(imps))
    t_act = len(acts) / bench_e2e.raw_consume(bootstrap, cfg.join.actions_topic, len(acts))
    r["raw_consume_events_per_s"] = n_in / (t_imp + t_act)
    print(f"  raw consume (confluent-kafka)  {r['raw_consume_events_per_s'] / 1e3:9.1f} k records/s", flush=True)

    got, span = _join_run(bootstrap, cfg, root / "join", 1, want)
    r["join_events_per_s"] = n_in / max(span, 1e-3)
    r["join_span_s"] = span
    print(f"  joiner (one worker)            {r['join_events_per_s'] / 1e3:9.1f} k records/s  "
          f"({got:,} examples over {span:.1f} s)", flush=True)
    two = worker_config(bootstrap, "join2", suffix, root / "join2", **{
        "join.impressions_topic": cfg.join.impressions_topic, "join.actions_topic": cfg.join.actions_topic})
    got, span = _join_run(bootstrap, two, root / "join2", 2, want)
    r["join_2_workers_events_per_s"] = n_in / max(span, 1e-3)
    r["join_scaling_2_workers"] = bench_e2e._ratio(r["join_2_workers_events_per_s"], r["join_events_per_s"])
    print(f"  joiner (two workers)           {r['join_2_workers_events_per_s'] / 1e3:9.1f} k records/s  "
          f"({got:,} examples over {span:.1f} s; {r['join_scaling_2_workers']:.2f}x one)", flush=True)

    jcfg = bench_e2e._config(root / "train", suffix)
    ensure_topics(bootstrap, [TopicSpec(jcfg.kafka.events_topic, PARTITIONS), TopicSpec(jcfg.kafka.dlq_topic, 1),
                              TopicSpec(jcfg.kafka.hotset_topic, 1)])
    from streamrec.ingest.codec import encode_json_batch

    msgs = [m for b in bench_e2e._events(jcfg, n_json) for m in encode_json_batch(b)][:n_json]
    bench_e2e._produce(bootstrap, jcfg.kafka.events_topic, msgs)
    del msgs
    t = bench_e2e.train_together({"json": bench_e2e._write_config(jcfg, root / "train.toml")},
                                 {"json": root / "train.log"}, {"json": Path(jcfg.trainer.log_path)}, bootstrap,
                                 {"json": n_json}, warmup_s, window_s)
    r["train_json_events_per_s"] = t["train_json_events_per_s"]
    r["train_json_ran_out"] = t["train_json_ran_out"]
    print(f"  trainer, JSON                  {r['train_json_events_per_s'] / 1e3:9.1f} k events/s", flush=True)
    workers = 2 if (os.cpu_count() or 1) >= 2 else 1  # one per core, as many as the bench runs
    joined = r["join_2_workers_events_per_s"] if workers == 2 else r["join_events_per_s"]
    r["join_vs_train_json"] = bench_e2e._ratio(joined, r["train_json_events_per_s"])
    r["join_vs_train_json_workers"] = workers
    r["join_vs_train_json_one_worker"] = bench_e2e._ratio(r["join_events_per_s"], r["train_json_events_per_s"])
    print(f"  joiner against the JSON trainer  {r['join_vs_train_json']:7.2f}x with {workers} worker(s), one per "
          f"core ({r['join_vs_train_json_one_worker']:.2f}x with one)", flush=True)
    r["join_vs_raw"] = bench_e2e._ratio(r["join_events_per_s"], r["raw_consume_events_per_s"])
    return r


def restart(bootstrap: str, size: str, root: Path) -> dict:
    from . import bench_e2e
    from .join_restart import measure_restart

    d = root / "restart"
    d.mkdir()
    m = measure_restart(bootstrap, RESTART_STATE[size], d, bench_e2e.STREAMREC)
    print(f"  restart after kill -9          {m['restart_s']:9.1f} s  ({m['state_impressions']:,} impressions of "
          f"state, {m['read_ahead_partitions']} of {PARTITIONS} partitions read ahead; the restarted worker's "
          f"log, stamped: {d / 'restart.log'})", flush=True)
    return {"restart_s": m["restart_s"], "restart_state_impressions": m["state_impressions"],
            "restart_read_ahead_partitions": m["read_ahead_partitions"]}


def freshness(bootstrap: str, size: str, q: dict) -> dict:
    from .bench_freshness import TINY_DRAIN_S, measure_freshness

    *_, seconds, warmup_s = SIZES[size]
    f = measure_freshness(bootstrap, rate=5000.0, seconds=seconds, warmup_s=warmup_s,
                          **({"drain_s": TINY_DRAIN_S} if size == "tiny" else {}))
    out = {"pipeline_freshness_p50_s": f["freshness_p50_s"], "pipeline_freshness_p99_s": f["freshness_p99_s"]}
    for mode in ("window", "fake_negative"):
        for pct in ("p50", "p99"):
            out[f"freshness_{pct}_s_{mode}"] = q[f"label_delay_{pct}_s_{mode}"] + f[f"freshness_{pct}_s"]
    return out


def goals(r: dict) -> list[dict]:
    def one(goal: str, key: str, ok) -> dict:
        v = r.get(key)
        if v is None or v != v:
            return {"goal": goal, "key": key, "value": None, "status": "FAIL", "reason": "not measured"}
        if key == "join_vs_train_json" and r.get("train_json_ran_out"):
            return {"goal": goal, "key": key, "value": v, "status": "FAIL",
                    "reason": "not measured: the trainer ran out of events inside its window (a lower-bound rate)"}
        return {"goal": goal, "key": key, "value": v, "status": "PASS" if ok(v) else "FAIL", "reason": ""}

    lo, hi = GOAL_CAL
    restart = one(f"restart_s <= {GOAL_RESTART_S:g} with {GOAL_RESTART_STATE:,} impressions of state", "restart_s",
                  lambda v: v <= GOAL_RESTART_S)
    if restart["value"] is not None and (r.get("restart_state_impressions") or 0) < GOAL_RESTART_STATE:
        restart.update(status="FAIL", reason=f"not measured: {r.get('restart_state_impressions')} impressions of "
                                             f"state, not {GOAL_RESTART_STATE:,}")
    return [restart, one(f"join_vs_train_json >= {GOAL_JOIN_X:g} (one worker per core)", "join_vs_train_json",
                         lambda v: v >= GOAL_JOIN_X),
            one(f"join_scaling_2_workers >= {GOAL_SCALING_2:g}", "join_scaling_2_workers",
                lambda v: v >= GOAL_SCALING_2),
            one(f"auc_gap_best <= {GOAL_GAP:g}", "auc_gap_best", lambda v: v <= GOAL_GAP),
            one(f"auc_gap_fake_negative_vs_delayed <= {GOAL_GAP:g}", "auc_gap_fake_negative_vs_delayed",
                lambda v: v <= GOAL_GAP),
            one(f"{lo:g} <= calibration_fake_negative <= {hi:g}", "calibration_fake_negative",
                lambda v: lo <= v <= hi)]


KEYS = ("join_events_per_s", "join_2_workers_events_per_s", "join_scaling_2_workers", "train_json_events_per_s",
        "raw_consume_events_per_s", "join_vs_train_json", "join_vs_train_json_workers",
        "join_vs_train_json_one_worker", "join_vs_raw", "auc_oracle", "auc_oracle_delayed",
        "auc_gap_label_delay", "auc_gap_fake_negative_vs_delayed", "auc_window", "auc_fake_negative",
        "auc_fake_negative_naive",
        "logloss_oracle", "logloss_window", "logloss_fake_negative", "logloss_fake_negative_naive", "auc_gap_best",
        "calibration_oracle", "calibration_window", "calibration_fake_negative", "calibration_fake_negative_naive",
        "freshness_p50_s_window", "freshness_p99_s_window", "freshness_p50_s_fake_negative",
        "freshness_p99_s_fake_negative", "label_delay_p50_s_window", "label_delay_p99_s_window",
        "label_delay_p50_s_fake_negative", "label_delay_p99_s_fake_negative", "pipeline_freshness_p50_s",
        "pipeline_freshness_p99_s", "state_bytes_per_impression", "state_rows_max", "train_json_ran_out",
        "join_impressions", "join_actions", "join_examples", "join_span_s", "quality_impressions", "seeds",
        "restart_s", "restart_state_impressions", "restart_read_ahead_partitions")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench join", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40k impressions for quality, 150k for throughput (~5 min)")
    ap.add_argument("--tiny", action="store_true",
                    help="a smoke run: checks the bench works, its figures mean little")
    ap.add_argument("--bootstrap", help="use this Kafka cluster instead of an embedded broker")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv or [])
    try:
        import confluent_kafka  # noqa: F401 - the producer and the raw-consume ceiling
    except ImportError:
        print("streamrec bench join needs confluent-kafka (the test extra: pip install -e '.[test]')")
        return 2
    from contextlib import nullcontext

    from streamrec.ingest import EmbeddedBroker

    size = "tiny" if args.tiny else "quick" if args.quick else "full"
    n_q, n_seeds, *_ = SIZES[size]
    r = quality(n_q, list(range(n_seeds)))
    print(f"  progressive AUC against the true labels: oracle {r['auc_oracle']:.5f}, window {r['auc_window']:.5f}, "
          f"fake_negative {r['auc_fake_negative']:.5f} (naive {r['auc_fake_negative_naive']:.5f}); "
          f"gap {r['auc_gap_best']:+.5f}", flush=True)
    print(f"  the gap's parts: waiting for each click (oracle_delayed {r['auc_oracle_delayed']:.5f}) "
          f"{r['auc_gap_label_delay']:+.5f}, fake_negative against that {r['auc_gap_fake_negative_vs_delayed']:+.5f}",
          flush=True)
    print(f"  calibration fake_negative {r['calibration_fake_negative']:.3f} (naive "
          f"{r['calibration_fake_negative_naive']:.3f}); state {r['state_bytes_per_impression'] or 0:.0f} "
          f"bytes per impression held", flush=True)
    root = Path(tempfile.mkdtemp(prefix="streamrec-bench-join-"))
    with (nullcontext() if args.bootstrap else EmbeddedBroker()) as broker:
        bs = args.bootstrap or broker.bootstrap
        r.update(throughput(bs, size, root))
        r.update(restart(bs, size, root))
        r.update(freshness(bs, size, r))
    shutil.rmtree(root, ignore_errors=True)  # kept when a step failed: its logs are named in the error
    print(f"  freshness p50/p99: window {r['freshness_p50_s_window']:.1f} / {r['freshness_p99_s_window']:.1f} s, "
          f"fake_negative {r['freshness_p50_s_fake_negative']:.1f} / {r['freshness_p99_s_fake_negative']:.1f} s")
    gs = goals(r)
    for g in gs:
        shown = (f"{g['value']:.4f}" if g["value"] is not None else "null") + (f"; {g['reason']}" if g["reason"] else "")
        print(f"  goal {g['status']}: {g['goal']} ({g['key']} = {shown})")
    if args.json:
        print(json.dumps({**{k: r.get(k) for k in KEYS}, "size": size, "goals": gs}))
    return 0
