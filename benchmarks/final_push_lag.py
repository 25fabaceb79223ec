"""Final push lag: the events a stopped trainer's final checkpoint holds that the version serving answers
with does not.

A real trainer process (``streamrec train``) trains a synthetic backlog from Kafka and pushes snapshots every
0.2 s (so a push is usually still pending when it stops) to a real serving server (this process, loopback,
its promotion guard at its defaults), and is stopped each of the three ways a run ends without the stream
ending: ``max_events`` (``--max-events``, the whole backlog), ``sigterm`` (SIGTERM once it has read half of
the backlog) and ``idle`` (``--idle-exit``, after the backlog). After the process exits, a stop's lag is the
final checkpoint's trained events minus those of the version serving serves (its manifest's ``events``
metric), or every event when serving serves nothing. ``final_push_lag_events`` is the largest over the
stops (goal 0). Each stop also reports the installed (newest) version's lag, whether the served version's
Kafka offsets are the checkpoint's, the trainer's exit code and how long its stop took.
``--json`` makes the last stdout line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

STOPS = ("max_events", "sigterm", "idle")
PUSH_EVERY_S = 0.2  # a push interval short enough that one is usually pending at the stop
IDLE_EXIT_S = 2.0


def _config(bootstrap: str, workdir: Path, stop: str, events: int):
    """The defaults, on fresh topics, trained on the CPU, pushing every ``PUSH_EVERY_S``, stopped by ``stop``."""
    from streamrec.app.config import load_config

    suffix = uuid.uuid4().hex[:8]
    return load_config(None, {
        "kafka.bootstrap": bootstrap, "kafka.events_topic": f"final-{suffix}", "kafka.dlq_topic": f"final-{suffix}.dlq",
        "kafka.hotset_topic": f"final-hot-{suffix}", "kafka.trainer_group": f"final-trainer-{suffix}",
        "kafka.consumer_mode": "assign", "kafka.events_per_message": 64,
        "trainer.device": "cpu", "trainer.torch_threads": 1, "trainer.hot_source": "none",
        "trainer.checkpoint_dir": str(workdir / "checkpoints"), "trainer.snapshot_dir": str(workdir / "snapshots"),
        "trainer.log_path": str(workdir / "trainer.jsonl"), "trainer.trace_path": str(workdir / "trace.jsonl"),
        "trainer.push_snapshots": True, "trainer.max_events": events if stop == "max_events" else 0,
        "trainer.idle_exit_s": IDLE_EXIT_S if stop == "idle" else 0.0, "store.path": str(workdir / "store"),
        "serving.host": "127.0.0.1", "serving.port": 0, "serving.data_dir": str(workdir / "serving"),
        "serving.push_token": uuid.uuid4().hex, "serving.push_every_s": PUSH_EVERY_S,
    }, env={})


def _produce(bootstrap: str, cfg, n: int) -> None:
    from streamrec.ingest import EventProducer, EventSchema, SyntheticStream, ensure_topics, pipeline_topics

    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(n):
        prod.send_batch(b)
    prod.close()


def _read(trace: Path) -> int:
    """Events the trainer has read so far, from its trace."""
    if not trace.exists():
        return 0
    return sum(json.loads(x).get("events", 0) for x in trace.read_text().splitlines()
               if x.strip() and '"ranges"' in x)


def served_lag(status: dict, checkpoint_dir: str | Path, snapshot_dir: str | Path) -> dict:
    """The lag of what serving holds (``status``: its ``Status`` answer as a dict) behind the newest checkpoint
    under ``checkpoint_dir``: trained events of the checkpoint not in the served version (``lag_events``)
    and not in the newest installed one (``installed_lag_events``), and whether the served version's Kafka
    offsets (its manifest, when still in ``snapshot_dir``) are the checkpoint's (None: not on disk)."""
    from streamrec.trainer.checkpoint import latest_checkpoint, read_checkpoint

    state, _ = read_checkpoint(latest_checkpoint(checkpoint_dir))
    events = int(state["events"])
    served = int(status.get("metrics", {}).get("events", 0)) if status.get("serving") else 0
    offsets_match = None
    manifest = Path(snapshot_dir) / f"v{int(status.get('version', 0)):09d}" / "manifest.json"
    if status.get("serving") and manifest.exists():
        m = json.loads(manifest.read_text())
        offsets_match = {f"{t}:{p}": int(o) for t, p, o in state["offsets"]} == {
            k: int(v) for k, v in m.get("kafka_offsets", {}).items()}
    installed = Path(snapshot_dir) / f"v{int(status.get('newest_version', 0)):09d}" / "manifest.json"
    installed_events = int(json.loads(installed.read_text())["metrics"].get("events", 0)) \
        if installed.exists() else served
    return {"checkpoint_events": events, "served_version": int(status.get("version", 0)),
            "served_events": served, "lag_events": max(0, events - served),
            "newest_version": int(status.get("newest_version", 0)),
            "installed_lag_events": max(0, events - installed_events), "held_reason": status.get("held_reason", ""),
            "offsets_match": offsets_match}


def _stop_run(proc: subprocess.Popen, stop: str, trace: Path, events: int, timeout: float) -> None:
    """Wait for the trainer to end by ``stop`` (SIGTERM: sent once it has read half the backlog)."""
    deadline = time.monotonic() + timeout
    if stop == "sigterm":
        while _read(trace) < events // 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def one_stop(bootstrap: str, stop: str, events: int, workdir: Path, timeout: float = 300.0) -> dict:
    """Train ``events`` with a real trainer process pushing to a real server, end it by ``stop``, measure."""
    import tomli_w

    from streamrec.app.wiring import server_settings
    from streamrec.serving import ServingClient, serve

    workdir.mkdir(parents=True, exist_ok=True)
    cfg = _config(bootstrap, workdir, stop, events)
    _produce(bootstrap, cfg, events)
    server = serve(server_settings(cfg), device="cpu", port=0)
    try:
        cfg = cfg.with_values(serving={"push_targets": server.target})
        (workdir / "config.toml").write_text(tomli_w.dumps(cfg.to_dict()))
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        with open(workdir / "trainer.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "streamrec", "train", "--config", str(workdir / "config.toml"),
                                     "--bootstrap", bootstrap, "--no-progress", "--log-level", "INFO"],
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
            t0 = time.monotonic()
            _stop_run(proc, stop, Path(cfg.trainer.trace_path), events, timeout)
        with ServingClient(server.target) as c:
            status = c.status()
    finally:
        server.stop(0.5)
    out = served_lag(status, cfg.trainer.checkpoint_dir, cfg.trainer.snapshot_dir)
    return {"stop": stop, "exit_code": proc.returncode, "run_seconds": round(time.monotonic() - t0, 2), **out}


def final_push_lag_events(tiny: bool, bootstrap: str | None = None) -> dict:
    """The three stops (module doc) on ``bootstrap`` (None: an embedded broker); per stop its figures, and
    ``final_push_lag_events``, the largest served lag (goal 0)."""
    from streamrec.ingest import EmbeddedBroker

    events = 4_000 if tiny else 20_000
    broker = None if bootstrap else EmbeddedBroker().start()
    try:
        with tempfile.TemporaryDirectory(prefix="streamrec-final-push-") as tmp:
            stops = {s: one_stop(bootstrap or broker.bootstrap, s, events, Path(tmp) / s) for s in STOPS}
    finally:
        if broker is not None:
            broker.stop()
    return {"final_push_lag_events": max(s["lag_events"] for s in stops.values()),
            "final_push_installed_lag_events": max(s["installed_lag_events"] for s in stops.values()),
            "stops": stops, "events": events, "goals": {"final_push_lag_events": "= 0"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamrec.benchmarks.final_push_lag",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="a smaller backlog (4,000 events instead of 20,000)")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--bootstrap", help="use this Kafka cluster instead of an embedded broker")
    a = p.parse_args(argv)
    r = final_push_lag_events(a.tiny, a.bootstrap)
    for s in r["stops"].values():
        print(f"{s['stop']:<10} checkpoint {s['checkpoint_events']:,} events, served v{s['served_version']} "
              f"{s['served_events']:,} (lag {s['lag_events']:,}), installed v{s['newest_version']} (lag "
              f"{s['installed_lag_events']:,}), offsets match {s['offsets_match']}, exit {s['exit_code']}, "
              f"{s['run_seconds']:.1f} s")
    print(f"final_push_lag_events {r['final_push_lag_events']:,} (goal 0)", flush=not a.json)
    if a.json:
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
