"""Partition merge: what ordering training by event time across partitions costs in latency.

A live stream (``--rate`` events/s, one JSON event per message, ts = the producer's wall clock)
goes into a fresh 4-partition topic through kafka-python's default partitioner (no key: each
message to a random partition), and a real trainer (``TrainerService``, in this process) trains
it, once with the merge off (``trainer.merge_wait_ms = 0``, the baseline) and once with it on
(``--wait-ms``, default the config default), each on its own topic, in the same run. Measured:

- ``wait_*``: the time each event spends in the merge, from the poll that brought it to its
  release into training (0 with the merge off);
- ``latency_*``: from the event's ts (its production) to its hand-over to training
  (``TrainerCore.feed``), on and off, and their ratio;
- ``inversions``: events handed to training with an older ts than the one before them (on/off).

``--json`` makes the last stdout line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np


def _config(bootstrap: str, workdir: Path, wait_ms: float):
    from streamrec.app.config import load_config

    cfg = load_config(None, {}, env={})
    suffix = uuid.uuid4().hex[:8]
    k = cfg.kafka
    k.bootstrap, k.partitions = bootstrap, 4
    k.events_topic, k.dlq_topic, k.hotset_topic = f"merge-{suffix}", f"merge-{suffix}.dlq", f"merge-hot-{suffix}"
    k.trainer_group, k.consumer_mode, k.events_per_message, k.codec = f"merge-{suffix}", "assign", 1, "json"
    t = cfg.trainer
    t.device, t.torch_threads, t.hot_source, t.snapshot_every = "cpu", 1, "none", 0
    t.checkpoint_dir, t.log_every_s, t.merge_wait_ms = str(workdir / "checkpoints"), 600.0, wait_ms
    cfg.store.path = str(workdir / "store")
    return cfg


def _produce(bootstrap, cfg, rate: float, seconds: float, box: dict) -> None:
    from kafka import KafkaProducer

    from streamrec.ingest import SyntheticStream, client_settings
    from streamrec.ingest.codec import encode_json

    events = [e for b in SyntheticStream(cfg).batches(min(int(rate * seconds), 200_000)) for e in b.to_events()]
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks=1, **client_settings(cfg.kafka))
    n, t0 = 0, time.monotonic()
    total = int(rate * seconds)
    while n < total:
        due = int((time.monotonic() - t0) * rate) + 1
        while n < min(due, total):
            ev = dict(events[n % len(events)])
            ev["ts"] = int(time.time() * 1000)
            p.send(cfg.kafka.events_topic, encode_json(ev))
            n += 1
        time.sleep(0.001)
    p.flush()
    p.close()
    box["produced"] = n


def _measure(bootstrap: str, rate: float, seconds: float, wait_ms: float) -> dict:
    from streamrec.ingest import ensure_topics, pipeline_topics
    from streamrec.trainer.core import TrainerCore
    from streamrec.trainer.merge import PartitionMerger
    from streamrec.trainer.service import TrainerService

    with tempfile.TemporaryDirectory(prefix="streamrec-merge-") as wd:
        cfg = _config(bootstrap, Path(wd), wait_ms)
        ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        total = int(rate * seconds)
        cfg.trainer.max_events = total
        from streamrec.app.wiring import trainer_settings

        svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
        waits: list[np.ndarray] = []
        arrived = np.zeros(total + 1)  # per merge arrival number: when the poll brought the event
        merger = svc.merger

        real_add, real_take = merger.add, merger._take

        def add(batch, now=None):
            arrived[merger.next_seq:merger.next_seq + len(batch)] = time.monotonic()
            return real_add(batch, now)

        def take(mask, keys):
            waits.append(time.monotonic() - arrived[merger.seq[mask]])
            return real_take(mask, keys)

        merger.add, merger._take = add, take
        lat: list[np.ndarray] = []
        fed_ts: list[np.ndarray] = []
        real_feed = svc.core.feed

        def feed(batch, flush=False):
            if len(batch):
                lat.append(time.time() * 1000 - batch.ts)
                fed_ts.append(np.asarray(batch.ts))
            return real_feed(batch, flush)

        svc.core.feed = feed
        box: dict = {}
        prod = threading.Thread(target=_produce, args=(bootstrap, cfg, rate, seconds, box), daemon=True)
        prod.start()
        res = svc.run()
        prod.join(60)
    lat_all = np.concatenate(lat) / 1000.0 if lat else np.zeros(1)
    w = np.concatenate(waits) if waits else np.zeros(total)
    if len(w) < len(lat_all):  # events that passed straight through (merge off, or one partition)
        w = np.concatenate([w, np.zeros(len(lat_all) - len(w))])
    order = np.concatenate(fed_ts) if fed_ts else np.zeros(1)
    return {"events": int(res["events"]), "produced": int(box.get("produced", 0)), "forced": int(merger.forced),
            "wait_p50_ms": float(np.percentile(w, 50) * 1000), "wait_p99_ms": float(np.percentile(w, 99) * 1000),
            "wait_mean_ms": float(w.mean() * 1000),
            "latency_p50_s": float(np.percentile(lat_all, 50)), "latency_p99_s": float(np.percentile(lat_all, 99)),
            "inversions": int((np.diff(order) < 0).sum())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a shorter run")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    ap.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    ap.add_argument("--rate", type=float, default=2000.0, help="events per second produced")
    ap.add_argument("--wait-ms", type=float, default=None, help="trainer.merge_wait_ms of the merged run")
    ap.add_argument("--bootstrap", help="use this Kafka cluster instead of an embedded broker")
    args = ap.parse_args(argv)
    from streamrec.app.config import load_config
    from streamrec.ingest import EmbeddedBroker

    wait = args.wait_ms if args.wait_ms is not None else load_config(None, {}, env={}).trainer.merge_wait_ms
    seconds = 1.0 if args.tiny else 8.0 if args.quick else 30.0
    broker = None if args.bootstrap else EmbeddedBroker().start()
    try:
        bs = args.bootstrap or broker.bootstrap
        off = _measure(bs, args.rate, seconds, 0.0)
        on = _measure(bs, args.rate, seconds, wait)
    finally:
        if broker is not None:
            broker.stop()
    out = {"rate_events_per_s": args.rate, "seconds": seconds, "partitions": 4, "merge_wait_ms": wait,
           **{f"{k}_on": v for k, v in on.items()}, **{f"{k}_off": v for k, v in off.items()}}
    out["latency_p50_ratio"] = on["latency_p50_s"] / max(off["latency_p50_s"], 1e-9)
    out["latency_p99_ratio"] = on["latency_p99_s"] / max(off["latency_p99_s"], 1e-9)
    print(f"merge of 4 partitions at {args.rate:,.0f} events/s for {seconds:.0f} s (one JSON event per message, "
          f"random partition per message), merge_wait_ms={wait:g}:")
    print(f"  wait in the merge per event: p50 {on['wait_p50_ms']:.0f} ms, p99 {on['wait_p99_ms']:.0f} ms, "
          f"mean {on['wait_mean_ms']:.0f} ms ({on['forced']} released by merge_max_events)")
    print(f"  ts -> training: p50 {on['latency_p50_s']:.3f} s on vs {off['latency_p50_s']:.3f} s off "
          f"({out['latency_p50_ratio']:.2f}x), p99 {on['latency_p99_s']:.3f} s vs {off['latency_p99_s']:.3f} s "
          f"({out['latency_p99_ratio']:.2f}x)")
    print(f"  order: {on['inversions']} ts inversions on vs {off['inversions']} off "
          f"(events {on['events']} / {off['events']})")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
