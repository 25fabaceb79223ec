"""The trainer's consumer alone, ``kafka.fast_records`` on vs off, in the same run.

One JSON event per Kafka message (the e2e bench's input: default model, 4
partitions, produced by confluent-kafka) on the embedded broker. Each repeat reads
the whole topic with a fresh :class:`~streamrec.ingest.EventConsumer` (assign mode, no
DLQ) twice per setting, alternating on/off so the machine's noise falls on both:

- ``records``: the client's records only (``consumer.poll``, values touched), i.e.
  fetch + record parsing (with the hook: one ``RecordRun`` per fetch, as the trainer's
  consumer gets them);
- ``decoded``: ``EventConsumer.poll_batch`` (what the trainer calls: records + the
  columnar JSON decode into an EventBatch).

For each: records/s (wall) and CPU us per record (process CPU: includes the
client's I/O), best of the repeats; ratios on/off. ``--json`` prints one JSON
object last. Usage::

    .venv/bin/python -m streamrec.benchmarks.bench_fast_records [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid


def _read(bootstrap: str, cfg, topic: str, n: int, fast: bool, decoded: bool) -> tuple[float, float]:
    from streamrec.ingest import EventConsumer, EventSchema
    from streamrec.ingest.fast_records import RecordRun

    cfg.kafka.fast_records = fast
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      f"bench-fr-{uuid.uuid4().hex[:6]}", mode="assign", dlq=False, topic=topic)
    try:
        if c.fast_records != fast:
            raise RuntimeError(f"fast_records={fast} asked, the consumer has {c.fast_records}")
        got = 0
        deadline = time.monotonic() + 300
        w0, c0 = time.perf_counter(), time.process_time()
        while got < n and time.monotonic() < deadline:
            if decoded:
                b = c.poll_batch(8192, timeout=1.0)
                got += len(b) if b is not None else 0
            else:
                for recs in c.consumer.poll(timeout_ms=1000, max_records=2000).values():
                    for r in recs:  # the hook hands out runs (fast_records.RecordRun), kafka-python records
                        if isinstance(r, RecordRun):
                            got += len(r.values())  # touch what the trainer reads
                        else:
                            got += 1
                            r.value  # noqa: B018
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if got != n or c.stats.dead_letters:
            raise RuntimeError(f"read {got} of {n} ({c.stats.dead_letters} dead letters)")
        return n / wall, cpu / n * 1e6
    finally:
        c.close()


def run(quick: bool, repeats: int | None = None) -> dict:
    from streamrec.benchmarks.bench_e2e import PARTITIONS, _config, _events, _produce
    from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics
    from streamrec.ingest.codec import encode_json_batch

    n = 100_000 if quick else 300_000
    repeats = repeats or (2 if quick else 3)
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="streamrec-bench-fr-"))
    cfg = _config(root, f"fr{os.getpid()}")
    r: dict = {"records": n, "partitions": PARTITIONS, "repeats": repeats}
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap
        ensure_topics(bs, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        msgs = [m for b in _events(cfg, n) for m in encode_json_batch(b)][:n]
        _produce(bs, cfg.kafka.events_topic, msgs)
        del msgs
        best: dict = {}
        for i in range(repeats):
            for kind in ("records", "decoded"):
                order = (True, False) if i % 2 == 0 else (False, True)
                for fast in order:
                    rate, cpu = _read(bs, cfg, cfg.kafka.events_topic, n, fast, kind == "decoded")
                    key = f"{kind}_{'on' if fast else 'off'}"
                    print(f"  {key:12s} {rate / 1e3:8.1f} k records/s  {cpu:6.2f} us CPU/record", flush=True)
                    old = best.get(key)
                    best[key] = (max(rate, old[0]), min(cpu, old[1])) if old else (rate, cpu)
    for key, (rate, cpu) in best.items():
        r[f"{key}_records_per_s"] = rate
        r[f"{key}_cpu_us_per_record"] = cpu
    for kind in ("records", "decoded"):
        r[f"{kind}_on_vs_off"] = r[f"{kind}_on_records_per_s"] / r[f"{kind}_off_records_per_s"]
        r[f"{kind}_cpu_off_vs_on"] = r[f"{kind}_off_cpu_us_per_record"] / r[f"{kind}_on_cpu_us_per_record"]
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_fast_records", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100k records, 2 repeats")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    r = run(args.quick)
    for kind in ("records", "decoded"):
        print(f"{kind}: fast_records on {r[f'{kind}_on_records_per_s'] / 1e3:.1f} k records/s "
              f"({r[f'{kind}_on_cpu_us_per_record']:.2f} us CPU/record), off "
              f"{r[f'{kind}_off_records_per_s'] / 1e3:.1f} k/s ({r[f'{kind}_off_cpu_us_per_record']:.2f} us): "
              f"{r[f'{kind}_on_vs_off']:.2f}x records/s, {r[f'{kind}_cpu_off_vs_on']:.2f}x less CPU")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
