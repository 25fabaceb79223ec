"""``streamrec bench e2e``: the pipeline on the input users send -- one JSON event per Kafka message.

Everything runs in one run on the embedded broker (tansu), the default model
(fields user, item, category, tags; 4 dense features), and the events are
produced by a client that is not streamrec's (confluent-kafka, as any third-party
producer would), one JSON object per message, 4 partitions:

- ``raw_consume_events_per_s`` (the ceiling): a bare confluent-kafka consumer
  reading the JSON topic's values, nothing decoded.
- ``sketch_events_per_s``: ``streamrec sketch`` (the real worker process: faust
  group and table, batched counting path) counting the JSON backlog, read off the
  hot sets it publishes (``events`` and ``created_ms`` of the first one and the
  first that covers the whole backlog; ``sketch.publish_interval_s`` 1 s here,
  so about one publish interval of uncertainty).
  Measured alone on the machine. ``sketch_cpu_us_per_event``: the worker's CPU
  time over that span per event (psutil).
- ``train_json_alone_events_per_s``: one ``streamrec train`` process
  (``kafka.consumer_mode=assign``, no serving, one torch thread) on the same JSON
  backlog, alone on the machine as the sketch was, its rate over a window after a
  warm-up. ``sketch_vs_train_json`` = the sketch's rate over this one (both alone,
  same events, same topic); ``sketch_vs_train_json_cpu`` the same per CPU-second.
- ``train_json_events_per_s`` and ``train_arrow_events_per_s``: two trainers, one
  on the JSON topic, one on the same events as Arrow IPC messages of
  ``kafka.events_per_message`` events, running side by side; both rates are
  taken over the same seconds (the overlap of their metrics logs after a
  warm-up), so ``train_json_vs_arrow`` is immune to the machine's noise.
  ``*_cpu_us_per_event``: each process's CPU per event over its window.

Goals: ``sketch_events_per_s >= 2 x train_json_alone_events_per_s`` (the sketch is
never the bottleneck) and ``train_json_vs_arrow >= 0.7``. Freshness at 5,000
events/s (``freshness_p50_s <= 2``, ``freshness_p99_s <= 5``) comes from
``bench_freshness.measure_freshness`` (:func:`_freshness`). Every goal is in the
output: one that could not be measured is a FAIL with the reason, and its figure
is ``null`` in the JSON (``goals`` lists each with ``status`` and ``reason``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from streamrec.foundation import ConfigError, parse_overrides, stop_process

from .common import add_device_arg, bench_device

STREAMREC = str(Path(sys.executable).with_name("streamrec"))
PARTITIONS = 4
GOAL_SKETCH_X = 2.0
GOAL_JSON_VS_ARROW = 0.7


def _config(root: Path, suffix: str, extra: dict[str, str] | None = None):
    """The bench's config; ``extra``: ``"section.key"`` overrides on top (validated as any override is)."""
    from streamrec.app.config import load_config

    return load_config(None, {
        "kafka.partitions": PARTITIONS,
        "kafka.events_topic": f"events-json-{suffix}",
        "kafka.dlq_topic": f"events-json-{suffix}.dlq",
        "kafka.hotset_topic": f"hot-set-{suffix}",
        "kafka.sketch_group": f"bench-sketch-{suffix}",
        "kafka.trainer_group": f"bench-trainer-{suffix}",
        "kafka.consumer_mode": "assign",
        "sketch.state_dir": str(root / "sketch"),
        # the rate is read off hot-set publish times: a 1 s interval (tick 0.5 s) bounds the error at ~1 s
        # (the default interval would publish the covering set up to that interval late, reading the rate low)
        "sketch.publish_interval_s": 1.0,
        "store.path": str(root / "store"),
        "trainer.checkpoint_dir": str(root / "ckpt"),
        "trainer.device": "cpu",
        "trainer.torch_threads": 1,
        "trainer.snapshot_every": 0,
        "trainer.push_snapshots": False,
        "trainer.log_every_s": 0.5,
        "trainer.log_path": str(root / "metrics.jsonl"),
        "serving.data_dir": str(root / "serving"),
        **(extra or {}),
    }, env={})


def _write_config(cfg, path: Path) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(cfg.to_dict()))
    return path


def _events(cfg, n: int):
    from streamrec.ingest import SyntheticStream

    s = SyntheticStream(cfg)
    s.chunk = 20_000
    return list(s.batches(n))


def _produce(bootstrap: str, topic: str, values, partitions: int = PARTITIONS) -> float:
    """Send ``values`` round-robin over the partitions with confluent-kafka; returns messages/s."""
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                     "queue.buffering.max.messages": 1_000_000, "message.max.bytes": 16 << 20, "log_level": 3})
    t0 = time.perf_counter()
    n = 0
    for v in values:
        while True:
            try:
                p.produce(topic, v, partition=n % partitions)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
    if p.flush(120):
        raise RuntimeError(f"confluent-kafka could not deliver every message to {topic}")
    return n / (time.perf_counter() - t0)


def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    """Records/s of a bare confluent-kafka consumer reading ``n`` records' values."""
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-raw-{os.getpid()}", "log_level": 3,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got, t0, deadline = 0, time.perf_counter(), time.monotonic() + 120
    while got < n and time.monotonic() < deadline:
        got += len([m.value() for m in c.consume(10_000, timeout=1.0) if m.error() is None])
    dt = time.perf_counter() - t0
    c.close()
    return got / dt


def _hot_sets(bootstrap: str, topic: str):
    """A consumer of the hot-set topic; yields parsed hot sets as they arrive."""
    import confluent_kafka as ck

    from streamrec.sketch import HotSet

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-hs-{os.getpid()}", "log_level": 3,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    return c, HotSet


def sketch_rate(cfg, bootstrap: str, config: Path, n: int, log: Path, timeout_s: float = 240.0) -> dict:
    """Start the sketch worker on the backlog of ``n`` JSON events; its counting rate from its hot sets: from
    the first one that counted part of the backlog to the first that counted all of it. When the first hot set
    already counts all of it (a small backlog), the span starts at the worker's process start instead, start-up
    included: the rate is then a lower bound and ``sketch_rate_lower_bound`` says so."""
    import psutil

    c, HotSet = _hot_sets(bootstrap, cfg.kafka.hotset_topic)
    with open(log, "ab") as f:
        proc = subprocess.Popen([STREAMREC, "sketch", "--config", str(config), "--bootstrap", bootstrap],
                                stdout=f, stderr=subprocess.STDOUT)
    ps = psutil.Process(proc.pid)
    first = last = None
    cpu_first = 0.0
    lower_bound = False
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            m = c.poll(0.2)
            if m is None or m.error() is not None or not m.value():
                continue
            hs = HotSet.from_bytes(m.value())
            cpu = sum(ps.cpu_times()[:2])
            if first is None and 0 < hs.events < n:
                first, cpu_first = hs, cpu
            elif hs.events >= n:
                if first is None:  # all counted before the first publish: span from the process start
                    lower_bound, cpu_first = True, 0.0
                    first = SimpleNamespace(events=0, created_ms=int(ps.create_time() * 1000))
                last, cpu_last = hs, cpu
                break
        if last is None:
            raise RuntimeError(f"the sketch worker did not count {n:,} events in {timeout_s:.0f} s "
                               f"(first hot set: {first and first.events}); log {log}:\n"
                               + log.read_text(errors="replace")[-3000:])
    finally:
        c.close()
        stop_process(proc, 20)
    dt = (last.created_ms - first.created_ms) / 1000
    counted = last.events - first.events
    return {"sketch_events_per_s": counted / dt, "sketch_span_s": dt, "sketch_events_in_span": counted,
            "sketch_cpu_us_per_event": (cpu_last - cpu_first) / counted * 1e6, "sketch_rate_lower_bound": lower_bound}


def _start_trainer(config: Path, bootstrap: str, log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen([STREAMREC, "train", "--config", str(config), "--bootstrap", bootstrap, "--no-progress"],
                            stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # the line being written
            pass
    return out


def _events_at(recs: list[dict], t: float) -> float:
    ts = np.array([r["ts"] for r in recs])
    ev = np.array([r["events"] for r in recs], dtype=np.float64)
    return float(np.interp(t, ts, ev))


def _rate_while_training(recs: list[dict]) -> float:
    """Events/s between the first metrics record past 0 events and the first at the final count: the
    rate of a trainer that finished before the measuring window opened (0.0 when fewer than two records
    fall in that span)."""
    moving = [r for r in recs if r["events"] > 0]
    if not moving:
        return 0.0
    last = next(r for r in moving if r["events"] >= moving[-1]["events"])
    span = last["ts"] - moving[0]["ts"]
    return (last["events"] - moving[0]["events"]) / span if span > 0 else 0.0


def train_together(configs: dict[str, Path], logs: dict[str, Path], metrics: dict[str, Path], bootstrap: str,
                   totals: dict[str, int], warmup_s: float, window_s: float) -> dict:
    """Run one trainer per config side by side; each one's events/s and CPU per event over the same window
    (``train_<key>_events_per_s``, ``train_<key>_cpu_us_per_event``, ``train_<key>_ran_out``: it trained its
    whole backlog inside the window, so its rate is a lower bound)."""
    import psutil

    procs = {k: _start_trainer(configs[k], bootstrap, logs[k]) for k in configs}
    try:
        # both are training (a first metrics record past 0 events), then a warm-up, then the window
        deadline = time.monotonic() + 180
        while not all(any(r["events"] > 0 for r in _records(metrics[k])) for k in procs):
            dead = [k for k, p in procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"trainer {dead or 'start'} failed; log:\n"
                                   + "".join(logs[k].read_text(errors="replace")[-2000:] for k in procs))
            time.sleep(0.5)
        time.sleep(warmup_s)
        ps = {k: psutil.Process(p.pid) for k, p in procs.items()}
        cpu0 = {k: sum(x.cpu_times()[:2]) for k, x in ps.items()}
        t0 = time.time()
        time.sleep(window_s)
        t1 = time.time()
        cpu = {k: sum(x.cpu_times()[:2]) - cpu0[k] for k, x in ps.items()}
        time.sleep(1.5)  # a metrics record after the window on both sides (log_every_s 0.5)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)  # both at once: they stop in parallel
        for p in procs.values():
            stop_process(p, 60)
    out = {"train_window_s": t1 - t0}
    for k in procs:
        recs = _records(metrics[k])
        done = _events_at(recs, t1)
        rate = (done - _events_at(recs, t0)) / (t1 - t0)
        if _events_at(recs, t0) >= totals[k]:  # the whole backlog went before the window opened
            rate = _rate_while_training(recs)
        out[f"train_{k}_ran_out"] = bool(done >= totals[k])
        if done >= totals[k]:
            print(f"  warning: the {k} trainer ran out of events inside the window: its rate is a lower bound")
        out[f"train_{k}_events_per_s"] = rate
        out[f"train_{k}_cpu_us_per_event"] = cpu[k] / max(1.0, rate * (t1 - t0)) * 1e6  # over the window
    return out


def _ratio(a: float, b: float) -> float | None:
    """``a / b``; ``None`` when ``b`` is not a positive rate (the goal then fails with that reason)."""
    return a / b if b > 0 else None


def decode_costs(cfg, n: int = 20_000, repeats: int = 5) -> dict:
    """CPU per event of ``Decoder.decode_many`` on one-event JSON records, integer ids and string ids:
    the columnar path, the record-by-record path (orjson + the validator) and the same with the standard
    library's parser (the record-by-record path without orjson). Best of ``repeats``."""
    import json as stdjson

    from streamrec.foundation import EventSchema
    from streamrec.ingest import Decoder
    from streamrec.ingest import codec
    from streamrec.ingest.codec import encode_json_batch

    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    dec = Decoder(schema)
    ints = [m for b in _events(cfg, n) for m in encode_json_batch(b)][:n]
    strs = []
    for m in ints:  # the same events with string ids
        ev = stdjson.loads(m)
        ev["sparse"] = {f: [f"id-{x}" for x in v] for f, v in ev["sparse"].items()}
        strs.append(stdjson.dumps(ev, separators=(",", ":")).encode())

    def best(fn, values) -> float:
        out = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            fn(values)
            out = min(out, time.process_time() - t0)
        return out / len(values) * 1e6

    def records(values):
        keep, codec._COLUMNS_MIN = codec._COLUMNS_MIN, 1 << 62
        try:
            dec.decode_many(values)
        finally:
            codec._COLUMNS_MIN = keep

    def stdlib(values):
        schema.batch_from_parsed([schema.validate(stdjson.loads(v)) for v in values])

    out = {}
    for kind, values in (("int", ints), ("str", strs)):
        out[f"decode_columns_{kind}_us"] = best(dec.decode_many, values)
        out[f"decode_records_orjson_{kind}_us"] = best(records, values)
        out[f"decode_records_stdlib_{kind}_us"] = best(stdlib, values)
    return out


def _freshness(bootstrap: str, quick: bool) -> dict:
    """``freshness_p50_s``/``freshness_p99_s`` (event in Kafka -> served model learned it) at 5,000 events/s.

    ``bench_freshness.measure_freshness`` (trainer + serving processes on this broker, JSON events produced
    at the rate). A measurement that fails returns ``freshness_error`` instead: its goals are then reported
    as FAIL with that reason; the throughput figures stand on their own.
    """
    from .bench_freshness import measure_freshness

    try:
        return measure_freshness(bootstrap, rate=5000.0, seconds=15.0 if quick else 30.0,
                                 warmup_s=10.0 if quick else 15.0)
    except Exception as e:  # noqa: BLE001 - reported as the goals' reason, not hidden
        print(f"  freshness: the measurement failed ({type(e).__name__}: {e})")
        return {"freshness_error": f"the measurement failed: {type(e).__name__}: {e}"}


SIZES = {  # (events per codec, training warm-up s, training window s): enough events for warm-up + window at
    # ~40k events/s, as a trainer that runs out reads low; tiny is a smoke run whose trainers may run out
    "full": (2_400_000, 8.0, 30.0), "quick": (600_000, 4.0, 10.0), "tiny": (30_000, 0.5, 1.5)}


def run(size: str = "full", freshness: bool = True, bootstrap: str | None = None) -> dict:
    from contextlib import nullcontext

    from streamrec.foundation import EventSchema
    from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics
    from streamrec.ingest.codec import encode_json_batch, encode_messages

    n_json, warmup_s, window_s = SIZES[size]
    n_arrow = n_json
    root = Path(tempfile.mkdtemp(prefix="streamrec-bench-e2e-"))
    suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    r: dict = {"json_events": n_json, "arrow_events": n_arrow}
    with (nullcontext() if bootstrap else EmbeddedBroker()) as broker:
        bs = bootstrap or broker.bootstrap
        cfg = _config(root / "json", suffix)
        cfg_arrow = _config(root / "arrow", suffix)
        cfg_arrow.kafka.events_topic = f"events-arrow-{suffix}"
        cfg_arrow.kafka.dlq_topic = f"events-arrow-{suffix}.dlq"
        cfg_arrow.kafka.trainer_group = f"bench-trainer-arrow-{suffix}"
        ensure_topics(bs, pipeline_topics(cfg.kafka, cfg.trainer.ranks)
                      + pipeline_topics(cfg_arrow.kafka, cfg_arrow.trainer.ranks))
        schema = EventSchema.from_sections(cfg.model, cfg.ingest)
        batches = _events(cfg, n_arrow)
        t0 = time.perf_counter()
        json_msgs = [m for b in batches[: -(-n_json // 20_000)] for m in encode_json_batch(b)][:n_json]
        r["json_encode_s"] = time.perf_counter() - t0
        arrow_msgs = [m for b in batches for m in encode_messages(b, schema, "arrow", cfg.kafka.events_per_message)]
        r["produce_json_msgs_per_s"] = _produce(bs, cfg.kafka.events_topic, json_msgs)
        _produce(bs, cfg_arrow.kafka.events_topic, arrow_msgs)
        del json_msgs, arrow_msgs, batches
        print(f"e2e bench: {n_json:,} JSON events (one per message) and {n_arrow:,} as Arrow "
              f"({cfg.kafka.events_per_message} per message), {PARTITIONS} partitions, produced by confluent-kafka "
              f"({r['produce_json_msgs_per_s'] / 1e3:.0f}k JSON messages/s)", flush=True)

        r.update(decode_costs(cfg, {"tiny": 2_000, "quick": 10_000}.get(size, 20_000), 5 if size != "tiny" else 1))
        for kind in ("int", "str"):
            print(f"  decode_many, {kind} ids: columnar {r[f'decode_columns_{kind}_us']:.2f} us/event, record by "
                  f"record {r[f'decode_records_orjson_{kind}_us']:.2f} (orjson), "
                  f"{r[f'decode_records_stdlib_{kind}_us']:.2f} (json module)", flush=True)
        r["raw_consume_events_per_s"] = raw_consume(bs, cfg.kafka.events_topic, n_json)
        print(f"  raw consume (confluent-kafka)  {r['raw_consume_events_per_s'] / 1e3:9.1f} k events/s", flush=True)

        r.update(sketch_rate(cfg, bs, _write_config(cfg, root / "sketch.toml"), n_json, root / "sketch.log"))
        print(f"  sketch worker                  {r['sketch_events_per_s'] / 1e3:9.1f} k events/s  "
              f"({r['sketch_cpu_us_per_event']:.1f} us CPU/event, over {r['sketch_span_s']:.1f} s)", flush=True)

        # the JSON trainer alone on the machine, as the sketch was: same topic and backlog, its own group and state
        cfg_alone = _config(root / "json-alone", suffix)
        cfg_alone.kafka.trainer_group = f"bench-trainer-alone-{suffix}"
        alone = train_together({"json_alone": _write_config(cfg_alone, root / "train-json-alone.toml")},
                               {"json_alone": root / "train-json-alone.log"},
                               {"json_alone": Path(cfg_alone.trainer.log_path)}, bs, {"json_alone": n_json},
                               warmup_s, window_s)
        r.update({k: v for k, v in alone.items() if k != "train_window_s"})
        print(f"  trainer, JSON, alone           {r['train_json_alone_events_per_s'] / 1e3:9.1f} k events/s  "
              f"({r['train_json_alone_cpu_us_per_event']:.1f} us CPU/event in its window)", flush=True)

        configs = {"json": _write_config(cfg, root / "train-json.toml"),
                   "arrow": _write_config(cfg_arrow, root / "train-arrow.toml")}
        r.update(train_together(configs, {k: root / f"train-{k}.log" for k in configs},
                                {"json": Path(cfg.trainer.log_path), "arrow": Path(cfg_arrow.trainer.log_path)},
                                bs, {"json": n_json, "arrow": n_arrow}, warmup_s, window_s))
        print(f"  trainer, JSON, beside Arrow    {r['train_json_events_per_s'] / 1e3:9.1f} k events/s  "
              f"({r['train_json_cpu_us_per_event']:.1f} us CPU/event in the window)")
        print(f"  trainer, Arrow                 {r['train_arrow_events_per_s'] / 1e3:9.1f} k events/s  "
              f"({r['train_arrow_cpu_us_per_event']:.1f} us CPU/event; side by side over the same "
              f"{r['train_window_s']:.0f} s)")
        if freshness:
            r.update(_freshness(bs, size != "full"))
        else:
            r["freshness_error"] = "not measured: --no-freshness"
        if "freshness_p50_s" in r:
            print(f"  freshness at 5,000 events/s    p50 {r['freshness_p50_s']:.2f} s, "
                  f"p99 {r['freshness_p99_s']:.2f} s")
    shutil.rmtree(root, ignore_errors=True)  # kept when a step failed: its logs are named in the error
    # both alone on the machine, on the same JSON backlog
    r["sketch_vs_train_json"] = _ratio(r["sketch_events_per_s"], r["train_json_alone_events_per_s"])
    # the same comparison per core: events one CPU-second buys in each
    r["sketch_vs_train_json_cpu"] = _ratio(r["train_json_alone_cpu_us_per_event"], r["sketch_cpu_us_per_event"])
    r["train_json_vs_arrow"] = _ratio(r["train_json_events_per_s"], r["train_arrow_events_per_s"])
    return r


ARROW_BACKLOG_GOAL = 500_000.0  # events/s from a Kafka Arrow backlog to a trained model, on a lent GPU


def run_arrow_backlog(size: str, device: str, bootstrap: str | None = None, batch: int = 0,
                      sets: dict[str, str] | None = None) -> dict:
    """``--arrow-backlog``: one ``streamrec train`` process on ``device`` draining an Arrow IPC backlog (the
    fast path: ``kafka.events_per_message`` events per message) on the broker, alone on the machine, with the
    trainer's own defaults but its device and torch threads (all cores). Its events/s over a window after a
    warm-up is what Kafka to a trained model sustains (``train_arrow_backlog_events_per_s``). ``batch`` (0: the
    trainer's default) sets ``trainer.batch_size``: a device trains at a batch that fills it; ``sets``: other
    settings of the bench's config (``{"trainer.checkpoint_every_events": "1000000"}``)."""
    from contextlib import nullcontext

    from streamrec.foundation import EventSchema
    from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics
    from streamrec.ingest.codec import encode_messages

    n, warmup_s, window_s = SIZES[size]
    # a device trainer drains a backlog many times faster than the JSON trainer it was sized for
    n *= 2 if size == "tiny" else 5
    root = Path(tempfile.mkdtemp(prefix="streamrec-bench-e2e-arrow-"))
    suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    with (nullcontext() if bootstrap else EmbeddedBroker()) as broker:
        bs = bootstrap or broker.bootstrap
        cfg = _config(root, suffix, {**(sets or {}), **({"trainer.batch_size": batch} if batch else {})})
        cfg.kafka.events_topic = f"events-arrow-{suffix}"
        cfg.kafka.dlq_topic = f"events-arrow-{suffix}.dlq"
        cfg.trainer.device = device
        cfg.trainer.torch_threads = 0  # every core: the device trainer's host side is what this measures
        ensure_topics(bs, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        schema = EventSchema.from_sections(cfg.model, cfg.ingest)
        msgs = [m for b in _events(cfg, n) for m in encode_messages(b, schema, "arrow", cfg.kafka.events_per_message)]
        _produce(bs, cfg.kafka.events_topic, msgs)
        del msgs
        print(f"e2e bench, Arrow backlog: {n:,} events ({cfg.kafka.events_per_message} per message), "
              f"one trainer on {device}, batch {cfg.trainer.batch_size}", flush=True)
        r = train_together({"arrow_backlog": _write_config(cfg, root / "train.toml")},
                           {"arrow_backlog": root / "train.log"}, {"arrow_backlog": Path(cfg.trainer.log_path)},
                           bs, {"arrow_backlog": n}, warmup_s, window_s)
    shutil.rmtree(root, ignore_errors=True)  # kept when a step failed: its logs are named in the error
    rate = r["train_arrow_backlog_events_per_s"]
    ok = rate >= ARROW_BACKLOG_GOAL
    print(f"  trainer, Arrow backlog, {device}: {rate / 1e3:9.1f} k events/s "
          f"(goal >= {ARROW_BACKLOG_GOAL / 1e3:.0f} k on a GPU: {'PASS' if ok else 'FAIL'})", flush=True)
    return {**r, "device": device, "events": n, "batch": cfg.trainer.batch_size,
            "checkpoint_every_events": cfg.trainer.checkpoint_every_events, "sets": dict(sets or {}),
            "goal_events_per_s": ARROW_BACKLOG_GOAL}


def goals(r: dict) -> list[dict]:
    """Every goal, measured or not: ``{"goal", "key", "value", "status": PASS|FAIL, "reason"}``."""
    def one(goal: str, key: str, ok, why_missing: str, ran_out: tuple[str, ...] = ()) -> dict:
        v = r.get(key)
        if v is None or v != v:
            return {"goal": goal, "key": key, "value": None, "status": "FAIL", "reason": why_missing}
        out = [k for k in ran_out if r.get(f"train_{k}_ran_out")]
        if out:  # a rate in the ratio is only a lower bound: the goal is not measured
            return {"goal": goal, "key": key, "value": v, "status": "FAIL",
                    "reason": f"not measured: the {' and '.join(out)} trainer(s) ran out of events inside the "
                              f"window (a lower-bound rate)"}
        return {"goal": goal, "key": key, "value": v, "status": "PASS" if ok(v) else "FAIL", "reason": ""}

    fresh_why = r.get("freshness_error", "not measured")
    return [
        one(f"sketch_events_per_s >= {GOAL_SKETCH_X:g} x train_json_alone_events_per_s", "sketch_vs_train_json",
            lambda v: v >= GOAL_SKETCH_X, "the JSON trainer alone trained nothing in its window", ("json_alone",)),
        one(f"train_json_vs_arrow >= {GOAL_JSON_VS_ARROW:g}", "train_json_vs_arrow",
            lambda v: v >= GOAL_JSON_VS_ARROW, "the Arrow trainer trained nothing in its window", ("json", "arrow")),
        one("freshness_p50_s <= 2", "freshness_p50_s", lambda v: v <= 2, fresh_why),
        one("freshness_p99_s <= 5", "freshness_p99_s", lambda v: v <= 5, fresh_why),
    ]


KEYS = ("sketch_events_per_s", "train_json_alone_events_per_s", "train_json_events_per_s", "train_arrow_events_per_s",
        "raw_consume_events_per_s", "train_json_vs_arrow", "sketch_vs_train_json", "sketch_vs_train_json_cpu",
        "sketch_cpu_us_per_event", "train_json_alone_cpu_us_per_event", "train_json_cpu_us_per_event",
        "train_arrow_cpu_us_per_event", "train_json_alone_ran_out", "train_json_ran_out", "train_arrow_ran_out",
        "sketch_rate_lower_bound",
        "freshness_p50_s", "freshness_p99_s",
        "json_events", "arrow_events", "train_window_s", "sketch_span_s", "decode_columns_int_us",
        "decode_records_orjson_int_us", "decode_records_stdlib_int_us", "decode_columns_str_us",
        "decode_records_orjson_str_us", "decode_records_stdlib_str_us")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench e2e", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="600k JSON events, a 10 s training window (~2 min)")
    ap.add_argument("--tiny", action="store_true",
                    help="a smoke run (30k events, 1.5 s training windows): checks the bench works, its figures "
                         "mean little (trainers may run out of events: their rates are then lower bounds)")
    ap.add_argument("--bootstrap", help="use this Kafka cluster instead of an embedded broker")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--no-freshness", action="store_true", help="throughput only (skip the freshness measurement)")
    ap.add_argument("--arrow-backlog", action="store_true",
                    help="instead: one trainer on --device draining an Arrow backlog (Kafka to a trained model)")
    ap.add_argument("--batch", type=int, default=0,
                    help="with --arrow-backlog: the trainer's trainer.batch_size (default: its configured one)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="sets",
                    help="with --arrow-backlog: a setting of the bench's config (repeatable)")
    add_device_arg(ap)
    args = ap.parse_args(argv or [])
    if args.batch < 0:
        ap.error("--batch must be >= 1 (or 0: the trainer's configured batch)")
    if args.arrow_backlog:
        size = "tiny" if args.tiny else "quick" if args.quick else "full"
        try:
            sets = parse_overrides(args.sets)
            r = run_arrow_backlog(size, str(bench_device(args.device, ap)), args.bootstrap, args.batch, sets)
        except ConfigError as e:  # a setting the config refuses: its one-line reason
            ap.error(str(e))
        if args.json:
            print(json.dumps({**r, "size": size}))
        return 0
    try:
        import confluent_kafka  # noqa: F401 - the third-party producer and the raw-consume ceiling
    except ImportError:
        print("streamrec bench e2e needs confluent-kafka (the test extra: pip install -e '.[test]')")
        return 2
    size = "tiny" if args.tiny else "quick" if args.quick else "full"
    r = run(size, freshness=not args.no_freshness, bootstrap=args.bootstrap)
    gs = goals(r)
    for g in gs:
        shown = (f"{g['value']:.2f}" if g["value"] is not None else "null") + (f"; {g['reason']}" if g["reason"] else "")
        print(f"  goal {g['status']}: {g['goal']} ({g['key']} = {shown})")
    if args.json:
        print(json.dumps({**{k: r.get(k) for k in KEYS}, "size": size, "goals": gs}))
    return 0
