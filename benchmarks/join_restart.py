"""How long a ``streamrec join`` worker takes to join again after ``kill -9``, with a given state behind it.

:func:`measure_restart` builds the state (``n`` impressions joined in ``fake_negative`` mode by one worker,
the attribution window wide enough that every impression is still held), kills that worker with SIGKILL,
produces one new impression per partition and starts the worker again: ``restart_s`` is the time from that
start to the last of those new impressions' examples on the events topic (the worker is joining again).
Each line the restarted worker logs is stamped with the seconds since its start (``restart.log``), which is
where a restart's time is seen to go (group join, state restore, first batch).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from .bench_join import PARTITIONS, _count_examples, _expected_examples, _partition, _produce_keyed, worker_config


def _stamp(proc: subprocess.Popen, t0: float, out: Path) -> threading.Thread:
    """Copy ``proc``'s output to ``out``, each line prefixed with the seconds since ``t0``."""
    def pump() -> None:
        with open(out, "w") as f:
            for line in proc.stdout:
                f.write(f"{time.monotonic() - t0:8.3f} {line.decode(errors='replace')}")
                f.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def _start(streamrec: str, conf: Path, bootstrap: str, log: Path):
    t0 = time.monotonic()
    proc = subprocess.Popen([streamrec, "join", "--config", str(conf), "--bootstrap", bootstrap,
                             "--faust-log-level", "info"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, t0, _stamp(proc, t0, log)


def _tail(bootstrap: str, topic: str):
    """A consumer of ``topic`` from its end offsets as they are now."""
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-restart-{os.getpid()}", "log_level": 3,
                     "enable.auto.commit": False})
    tps = []
    for p in range(PARTITIONS):
        _, hi = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)
        tps.append(ck.TopicPartition(topic, p, hi))
    c.assign(tps)
    return c


def _wait_new(c, want: int, proc, log: Path, timeout_s: float) -> float:
    """Wait until the consumer ``c`` read ``want`` examples of the new impressions (keyed ``restart-*``); when the
    last came."""
    got, deadline = 0, time.monotonic() + timeout_s
    try:
        while got < want:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the restarted joiner wrote {got} of {want} new examples (exit {proc.poll()}); "
                                   f"log {log}:\n" + log.read_text(errors="replace")[-3000:])
            got += sum(m.error() is None and (m.key() or b"").startswith(b"restart-")
                       for m in c.consume(100, timeout=0.05))
    finally:
        c.close()
    return time.monotonic()


def measure_restart(bootstrap: str, n: int, root: Path, streamrec: str) -> dict:
    """``restart_s`` (seconds from the restarted worker's start to it joining again), ``build_s`` (the first
    run's time to join the ``n`` impressions), ``state_impressions`` (``n``) and ``read_ahead_partitions``
    (the partitions whose state the restarted worker read while it joined its group, by its log)."""
    import tomli_w

    from streamrec.joiner import DelayedStream

    suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    cfg = worker_config(bootstrap, "restart", suffix, root / "state", **{"join.window_s": 36_000.0})
    imps, acts, _ = DelayedStream(cfg.model, cfg.generator, seed=13).generate(n)
    want = _expected_examples(cfg, imps, acts)
    _produce_keyed(bootstrap, cfg.join.impressions_topic, imps)
    _produce_keyed(bootstrap, cfg.join.actions_topic, acts)
    conf = root / "restart.toml"
    conf.write_text(tomli_w.dumps(cfg.to_dict()))
    proc, t0, pump = _start(streamrec, conf, bootstrap, root / "build.log")
    try:
        _count_examples(bootstrap, cfg.kafka.events_topic, want, proc, root / "build.log", 900.0)
        build_s = time.monotonic() - t0
        time.sleep(1.0)  # the last batch's changelog records are acknowledged
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        pump.join(5)
    last = max(ev["ts"] for ev in imps)
    fresh, seen = [], set()
    for i in range(10_000):  # one new impression per partition, after every held one in event time
        rid = f"restart-{i}"
        if _partition(rid) not in seen:
            seen.add(_partition(rid))
            fresh.append({**imps[-1], "request_id": rid, "ts": last + 1 + i})
        if len(seen) == PARTITIONS:
            break
    _produce_keyed(bootstrap, cfg.join.impressions_topic, fresh)
    log = root / "restart.log"
    tail = _tail(bootstrap, cfg.kafka.events_topic)
    proc, t0, pump = _start(streamrec, conf, bootstrap, log)
    try:
        restart_s = _wait_new(tail, len(fresh), proc, log, 600.0) - t0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        pump.join(5)
    ahead = set(re.findall(r"partition (\d+): join state restored at batch \d+ \(\d+ rows, read ahead",
                           log.read_text(errors="replace")))
    return {"restart_s": restart_s, "build_s": build_s, "state_impressions": n, "read_ahead_partitions": len(ahead)}


if __name__ == "__main__":  # python -m benchmarks.join_restart N DIR: one measurement, the stamped log kept in DIR
    import sys

    from streamrec.ingest import EmbeddedBroker

    from .bench_e2e import STREAMREC

    d = Path(sys.argv[2])
    d.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker() as b:
        print(json.dumps(measure_restart(b.bootstrap, int(sys.argv[1]), d, STREAMREC)))
