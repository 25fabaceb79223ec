"""The trainer as a process (`streamrec train`) against the real embedded broker: killed with
SIGKILL it resumes losing nothing (at most one checkpoint interval is trained twice); SIGTERM
drains it with a final checkpoint while it serves Prometheus metrics; and a trainer that dies
between its checkpoint and its offset commit has already put its dead letters in the DLQ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import tomli_w
from kafka import KafkaConsumer, TopicPartition

from streamrec.ingest import read_topic
from streamrec.trainer.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint
from tests.helpers.trainer import BS, CKPT_EVERY, PER_MESSAGE, produce, read_jsonl, stream_cfg, trainer_cfg

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

EVENTS = 48_000


def _end_offsets(bootstrap, topic):
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
    ends = c.end_offsets(tps)
    c.close()
    return {tp.partition: o for tp, o in ends.items()}


@pytest.mark.timeout(420)  # above its own waits: 120 s to two checkpoints, 240 s for the resumed run, 30 s to read
def test_crash_and_resume_loses_nothing(topics, tmp_path, bootstrap):
    cfg = trainer_cfg(topics, tmp_path)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    produce(cfg, bootstrap, EVENTS)
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--no-progress", "--log-level", "WARNING"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    trace = tmp_path / "trace.jsonl"

    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while sum("checkpoint" in r for r in read_jsonl(trace)) < 2:  # two checkpoints in, then kill -9
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "trainer made no checkpoints"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    before = read_jsonl(trace)
    killed_ckpt = max(r["checkpoint"] for r in before if "checkpoint" in r)
    assert sum(r.get("events", 0) for r in before if "ranges" in r) < EVENTS, "killed too late: nothing left to resume"

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-4000:]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["reason"] == "idle"

    records = read_jsonl(trace)
    n_messages = -(-8192 // PER_MESSAGE) * (EVENTS // 8192) + -(-(EVENTS % 8192) // PER_MESSAGE)
    recs = read_topic(bootstrap, cfg.kafka.events_topic, expected=n_messages, timeout=30)
    assert len(recs) == n_messages
    ends = {p: 1 + max(r.offset for r in recs if r.partition == p) for p in {r.partition for r in recs}}
    starts = [r for r in records if r.get("start")]
    assert len(starts) == 2 and starts[1]["seq"] >= killed_ckpt  # resumed from the newest complete checkpoint
    ck_state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    resume_positions = {p: o for _t, p, o in starts[1]["positions"]}
    # every offset of every partition trained at least once; count the replays
    trained: Counter = Counter()
    for r in records:
        if "ranges" in r:
            for _t, p, a, b in r["ranges"]:
                for o in range(a, b):
                    trained[(p, o)] += 1
    for p, end in ends.items():
        missing = [o for o in range(end) if trained[(p, o)] == 0]
        assert not missing, f"partition {p}: offsets {missing[:5]} never trained"
    dup_messages = sum(c - 1 for c in trained.values() if c > 1)
    # at most one checkpoint interval (plus the window that crossed it) is trained twice
    assert dup_messages * PER_MESSAGE <= CKPT_EVERY + BS * cfg.trainer.window_batches + PER_MESSAGE * len(ends)
    # the final checkpoint covers the whole topic, and its offsets are committed
    assert {p: o for _t, p, o in ck_state["offsets"]} == ends
    assert all(resume_positions[p] <= ends[p] for p in ends)
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.kafka.trainer_group, enable_auto_commit=False)
    committed = {p: c.committed(TopicPartition(cfg.kafka.events_topic, p)) for p in ends}
    c.close()
    assert committed == ends
    assert len(list_checkpoints(cfg.trainer.checkpoint_dir)) <= cfg.trainer.keep_checkpoints
    log = read_jsonl(tmp_path / "metrics.jsonl")
    # the killed and resumed trainer measures a progressive AUC of 0.725 on these 48k events (one trainer in process,
    # never killed: 0.731; Bayes-optimal 0.84): the floor is 0.045 below it
    assert log[-1]["events"] >= EVENTS and log[-1]["auc"] > 0.68, log[-1]
    assert max(r["hot_fraction"] or 0 for r in log) > 0.2  # the in-process hot set took FAE into effect
    assert sorted(Path(cfg.trainer.snapshot_dir).glob("v*/manifest.json")), "no snapshot was built"


def test_sigterm_drains_with_final_checkpoint_and_serves_prometheus(topics, tmp_path, bootstrap):
    import urllib.request

    from streamrec.ingest import free_port

    cfg = trainer_cfg(topics, tmp_path)
    cfg.trainer.idle_exit_s = 0.0  # would run forever: only the signal stops it
    cfg.trainer.checkpoint_every_events = 10**9
    cfg.trainer.metrics_port = free_port()
    cfg.store.expire_after_s = 0.001  # the final checkpoint's sweep expires every untouched cold row
    # lean tables on the live path: ids admitted from their second step, tables capped by eviction sweeps
    cfg.store.admit_min_count, cfg.store.max_rows = 2, 300
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    produce(cfg, bootstrap, 8_192)
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--no-progress", "--log-level", "WARNING"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trace = tmp_path / "trace.jsonl"
    deadline = time.monotonic() + 90
    while sum(r.get("events", 0) for r in read_jsonl(trace) if "ranges" in r) < 8_192:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:] if proc.poll() else "slow"
        time.sleep(0.05)
    deadline = time.monotonic() + 20  # the next metrics interval publishes the count (slower under load)
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{cfg.trainer.metrics_port}/metrics", timeout=5).read().decode()
        if "streamrec_trainer_events_trained_total 8192.0" in body or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "streamrec_trainer_events_trained_total 8192.0" in body
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["reason"] == "stopped"
    state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    trained_to = {}
    for r in read_jsonl(trace):
        for _t, p, _a, b in r.get("ranges", []):
            trained_to[p] = b
    assert state["events"] == 8_192 and {p: o for _t, p, o in state["offsets"]} == trained_to
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert last["rows_expired"] > 0
    assert last["rows_evicted"] > 0 and last["ids_unadmitted"] > 0
    assert "streamrec_trainer_rows_evicted_total" in body and "streamrec_trainer_ids_unadmitted_total" in body
    assert state["rows_evicted"] == last["rows_evicted"]  # the total carries over a resume


def test_dead_letters_reach_the_dlq_before_a_checkpoint_moves_past_them(topics, tmp_path, bootstrap):
    """The dead-letter producer is flushed before a checkpoint is written, not only when offsets are
    committed after it: a trainer dying in between resumes past the bad records, so their dead letters
    must already be in the DLQ."""
    cfg = stream_cfg(topics, tmp_path)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    produce(cfg, bootstrap, 512, bad=3)
    # the trainer dies right after its checkpoint is renamed into place (before the offsets commit);
    # a long linger keeps the dead letters in the producer's buffer until somebody flushes it
    script = (
        "import os, sys\n"
        "from streamrec.ingest import make_producer\n"
        "from streamrec.app.config import load_config\n"
        "from streamrec.app.wiring import trainer_settings\n"
        "from streamrec.trainer import TrainerService\n"
        "svc = TrainerService(trainer_settings(load_config(sys.argv[1], env={})), sys.argv[2], progress=False)\n"
        "svc.consumer._dlq.close()\n"
        "svc.consumer._dlq = make_producer(sys.argv[2], linger_ms=600_000, delivery_timeout_ms=700_000)\n"
        "svc.consumer.mark_durable = lambda offsets: os._exit(9)\n"
        "svc.run()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-c", script, str(cfg_path), bootstrap], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr[-3000:]
    state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    assert state["dead_letters"] == 3  # the checkpoint is past the bad records: a resume never reads them again
    assert len(read_topic(bootstrap, cfg.kafka.dlq_topic, expected=3, timeout=5)) == 3
