"""``bench cluster``'s services host: a serving replica and the sketch worker lost mid-run, and returned.

The cluster's last host runs what a platform team puts beside the trainers: the popularity-sketch worker
(``streamrec sketch``) and a second serving replica (``streamrec serve``); host 0 runs the first replica and
a prober. The trainer group (hosts 1..N, ``trainer.hot_source = "topic"``: it follows the sketch's hot sets)
pushes every snapshot to both replicas (``serving.push_targets``). Once the group trains with a hot set, the
services host is lost (``kill``: SIGKILL to all it runs; ``cut``: its link down) and comes back
``RETURN_AFTER_S`` later (``kill``: the replica and the sketch worker are started again, as an operator
would; ``cut``: the link is healed, the processes never stopped).

Per run (``services_<how>``):

- ``train_max_gap_s``: the longest time between two metrics records (every 0.5 s) while the group trains,
  from the loss to its last event: a lost replica or sketch must not stall training
  (``train_max_gap_before_s``: the same before the loss, where checkpoints and snapshots make the gaps);
  ``events_per_s_before`` / ``events_per_s_after`` (the loss to the return);
- ``events_lost`` (the group's final checkpoint against the topic) and ``events_duplicated`` (no restart:
  0 expected);
- ``predict_failed`` on the replica that stayed (every 50 ms, from its first answer) and the versions it
  served before and after the loss (``served_version_at_loss`` < ``served_version_end``: pushes go on);
- ``hot_version_at_loss`` / ``hot_version_end``: the group keeps training on the last hot set it had;
- ``replica_caught_up_s``: from the return to the returned replica serving the version the other one serves
  (a replica that missed versions refuses the next delta, which makes the trainer's next snapshot full).
"""

from __future__ import annotations

import json
import sys
import time

RETURN_AFTER_S = 5.0  # how long the services host stays lost

WATCHER = """
import json, sys, time
from pathlib import Path
from streamrec.serving import ServingClient
a, b, token, stop, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5])
ca, cb = ServingClient(a, timeout=2.0, token=token), ServingClient(b, timeout=0.5, token=token)
events = [{"dense": [0.1] * int(sys.argv[6]), "sparse": {f: [i] for f in sys.argv[7].split(",")}} for i in range(8)]
ok = failed = 0
timeline, last_b = [], 0.0
while not stop.exists():
    now = time.time()
    va = vb = None
    try:
        _, va = ca.predict(events)
        ok += 1
        (out.parent / "watch.ready").touch()
    except Exception:
        failed += 1 if ok else 0
    if now - last_b >= 0.5:
        last_b = now
        try:
            vb = int(cb.status()["version"])
        except Exception:
            vb = -1
    timeline.append([now, va, vb])
    time.sleep(0.05)
out.write_text(json.dumps({"ok": ok, "failed": failed, "timeline": timeline}))
"""  # Predict on the replica that stays every 50 ms, the other's version every 0.5 s (-1: unreachable)


def services_loss(b, how: str, mbit: float, timeout_s: float = 600.0) -> dict:
    """Lose the services host of ``b`` (a ``ClusterBench``) mid-run, ``how`` = ``kill`` | ``cut``, over links
    at ``mbit``; its figures (the module's docstring)."""
    from .bench_cluster import CHECKPOINT_EVERY_S, _records, _streamrec

    c = b.cluster
    s = len(c.hosts) - 1
    h0, hs = c.hosts[0], c.hosts[s]
    name = f"services-{how}"
    port = 50071 if how == "kill" else 50072
    a, z = f"{h0.address}:{port}", f"{hs.address}:{port}"
    c.shape(mbit)
    cfg = b._config(name, **{
        "trainer.hot_source": "topic", "kafka.hotset_topic": f"hot-set-{name}", "kafka.sketch_group": f"sketch-{name}",
        "sketch.state_dir": str(b.root / name / "sketch"), "sketch.publish_interval_s": 1.0,
        "trainer.checkpoint_every_s": CHECKPOINT_EVERY_S, "trainer.snapshot_every": 1, "serving.push_every_s": 1.0,
        "serving.target": a, "serving.push_targets": f"{a},{z}", "serving.host": h0.address, "serving.port": port,
        "serving.push_token": "bench", "serving.data_dir": str(b.root / name / "serving-0")})
    other = ["--set", f"serving.host={hs.address}", "--set", f"serving.data_dir={b.root / name / 'serving-s'}"]

    def start_services():
        c.spawn(s, [*_streamrec(), "serve", "--config", str(cfg), *other], f"serve-{name}")
        c.spawn(s, [*_streamrec(), "sketch", "--config", str(cfg), "--bootstrap", b.bootstrap], f"sketch-{name}")

    c.spawn(0, [*_streamrec(), "serve", "--config", str(cfg)], f"serve-{name}")
    start_services()
    sketch_log = b.root / "hosts" / f"h{s}-sketch-{name}.log"
    deadline = time.monotonic() + 180
    while "published hot set" not in (sketch_log.read_text(errors="replace") if sketch_log.exists() else ""):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sketch worker published no hot set; logs in {b.root / 'hosts'}")
        time.sleep(0.2)
    from streamrec.app.config import load_config

    mc = load_config(str(cfg), env={}).model
    stop, out = b.root / name / "stop-watch", b.root / name / "watch.json"
    watcher = c.spawn(0, [sys.executable, "-c", WATCHER, a, z, "bench", str(stop), str(out), str(mc.dense_dim),
                          ",".join(mc.field_names)], f"watch-{name}")
    env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    procs = [c.spawn(h, b._group_cmd(h, cfg, str(b.ranks)), f"train-{name}", env=env) for h in range(1, b.ranks + 1)]
    metrics = b.root / name / "metrics.jsonl"
    while not any(r.get("hot_version", 0) and r.get("events", 0) > 0 and r.get("snapshot_version", 0) >= 1
                  for r in _records(metrics)) or not (b.root / name / "watch.ready").exists():
        if time.monotonic() > deadline or procs[0].poll() is not None:
            raise RuntimeError(f"the services run did not get going; logs in {b.root / 'hosts'}")
        time.sleep(0.1)
    at = [r for r in _records(metrics) if "events" in r][-1]
    lost = time.time()
    if how == "kill":
        c.kill_host(s)
    else:
        c.cut(s)
    time.sleep(RETURN_AFTER_S)
    returned = time.time()
    if how == "kill":
        start_services()
    else:
        c.heal(s)
    try:
        b._wait(procs, timeout_s, name)
        time.sleep(3.0)  # the final push reaches both replicas
    finally:
        stop.touch()
        watcher.wait(30)
    watch = json.loads(out.read_text()) if out.exists() else {}
    caught = _caught_up_from(watch.get("timeline") or [], returned)
    recs = [r for r in _records(metrics) if "events" in r]
    last_event = max(r["events"] for r in recs)
    after = [r for r in recs if r["ts"] >= lost and r["events"] < last_event] or [r for r in recs if r["ts"] >= lost]
    gaps = [y["ts"] - x["ts"] for x, y in zip([at, *after], after)]
    training = [r for r in recs if 0 < r["events"] < last_event and r["ts"] < lost]
    gaps_before = [y["ts"] - x["ts"] for x, y in zip(training, training[1:])]
    rate = lambda x, y: (y["events"] - x["events"]) / (y["ts"] - x["ts"]) if y["ts"] > x["ts"] else None  # noqa: E731
    before = [r for r in recs if r["ts"] < lost and r["events"] > 0]
    upto = [r for r in recs if lost <= r["ts"] <= returned]
    served = [(t, va) for t, va, _vb in watch.get("timeline") or [] if va is not None]
    return {
        "events_at_loss": at["events"], "after_end": at["events"] >= b.events,
        "train_max_gap_s": max(gaps) if gaps else None,
        "train_max_gap_before_s": max(gaps_before) if gaps_before else None,
        "events_per_s_before": rate(before[0], before[-1]) if len(before) >= 2 else None,
        "events_per_s_after": rate(upto[0], upto[-1]) if len(upto) >= 2 else None,
        **b.lost_and_twice(name),
        "predict_ok": watch.get("ok"), "predict_failed": watch.get("failed"),
        "served_version_at_loss": max((v for t, v in served if t <= lost), default=None),
        "served_version_end": served[-1][1] if served else None,
        "hot_version_at_loss": at.get("hot_version"), "hot_version_end": recs[-1].get("hot_version"),
        "replicas_behind_max": max((r.get("replicas_behind", 0) for r in recs), default=0),
        "replica_caught_up_s": caught,
    }


def _caught_up_from(timeline: list, returned: float) -> float | None:
    """Seconds from the return to the first moment the returned replica serves (at least) the version the
    other one served at that moment, or None."""
    last_a = None
    for t, va, vb in timeline:
        if va is not None:
            last_a = va
        if t >= returned and vb is not None and vb >= 0 and last_a is not None and vb >= last_a:
            return t - returned
    return None
