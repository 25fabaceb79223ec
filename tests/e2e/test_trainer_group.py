"""A trainer group (`streamrec train --nproc N`, torch.distributed.run, gloo on loopback) against the
real embedded broker: killed with SIGKILL at ten points in turn (mid-step, mid-shard, between shard and
manifest, between manifest and commit, mid-snapshot, ...) it restarts from its last complete checkpoint
each time and in the end has trained every event, re-trained at most one interval per restart, and
committed every partition's offset; restarted with 3 ranks it reshards and goes on; fewer partitions
than ranks is refused before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from kafka import KafkaConsumer, TopicPartition

from streamrec.ingest import EventProducer, EventSchema, SyntheticStream, ensure_topics, pipeline_topics, read_topic
from streamrec.trainer.checkpoint import latest_checkpoint, read_checkpoint
from tests.conftest import HEAVY_GROUP
from tests.helpers.trainer import BS, PER_MESSAGE, read_jsonl, trainer_cfg

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

CKPT_EVERY = 2048
# Every run starts with its records already in the topic (the killed group's 100k events are produced before its
# first launch, enough that ten launches cannot drain them: a launch whose failpoint waits for a snapshot trains on
# until the snapshot comes, and a drained backlog leaves the later failpoints unreached). The
# killed group idles out after 5 s of silence (eleven launches, each restoring a checkpoint before its first fetch,
# on a loaded machine); the clean and the 3-rank runs launch once, and 2 s of silence means the end.
KILLED_IDLE_EXIT_S = 5.0
SETTLED_IDLE_EXIT_S = 2.0
KILLS = [  # (failpoint, rank): one per launch, in turn
    ("group.trained#3", 1),
    ("group.mid_shard#1", 0),
    ("group.shard_written#1", 1),
    ("group.before_manifest#1", 0),
    ("group.manifest_written#1", 0),
    ("group.committed#1", 0),
    ("group.snapshot_rows#1", 1),
    ("group.snapshot_build#1", 0),
    ("group.mid_step#25", 1),
    ("group.mid_shard#2", 1),
]


def _failpoints() -> str:
    out = []
    for restart, (point, rank) in enumerate(KILLS):
        name, _, nth = point.partition("#")
        out.append(f"{name}@{rank}#{nth}/{restart}")
    return ",".join(out)


def _ends(bootstrap, topic, messages: int) -> dict[int, int]:
    """Each partition's log end, from the records themselves (the embedded broker's high watermark can
    trail the log end for a while)."""
    recs = read_topic(bootstrap, topic, expected=messages, timeout=30)
    assert len(recs) == messages
    return {p: 1 + max(r.offset for r in recs if r.partition == p) for p in {r.partition for r in recs}}


def _committed(bootstrap, cfg, parts) -> dict[int, int | None]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.kafka.trainer_group, enable_auto_commit=False)
    out = {p: c.committed(TopicPartition(cfg.kafka.events_topic, p)) for p in parts}
    c.close()
    return out


def _trained(tmp_path, ranks) -> tuple[Counter, int]:
    """(times each (partition, offset) was trained, launches) over every rank's trace."""
    trained: Counter = Counter()
    starts = 0
    for r in range(ranks):
        for rec in read_jsonl(tmp_path / f"trace.jsonl.rank{r}"):
            starts += bool(rec.get("start")) and r == 0
            for _t, p, a, b in rec.get("ranges", []):
                for o in range(a, b):
                    trained[(p, o)] += 1
    return trained, starts


def _group_cfg(topics, tmp_path):
    cfg = trainer_cfg(topics, tmp_path)
    cfg.trainer.checkpoint_every_events = CKPT_EVERY
    cfg.trainer.idle_exit_s = KILLED_IDLE_EXIT_S
    return cfg


def _train(cfg, tmp_path, bootstrap, nproc, env_extra=None, timeout=400):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), **(env_extra or {}))
    cmd = [sys.executable, "-m", "streamrec", "train", "--nproc", str(nproc), "--config", str(cfg_path),
           "--bootstrap", bootstrap, "--no-progress", "--log-level", "WARNING"]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # what the group said before it was stopped, not only that it was
        out = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"{nproc}-rank group still running after {timeout} s; its stderr:\n{out[-8000:]}") from None


def _produce_backlog(cfg, bootstrap, n) -> int:
    """``n`` synthetic events into the events topic, two messages' worth per send; returns the records sent."""
    import numpy as np

    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    step = PER_MESSAGE * 2
    for chunk in SyntheticStream(cfg).batches(n):
        for s in range(0, len(chunk), step):
            prod.send_batch(chunk.take(np.arange(s, min(len(chunk), s + step))))
    prod.close()
    return prod.sent_messages


def _start_serving(cfg, tmp_path):
    from streamrec.ingest import free_port
    from streamrec.serving import ServingClient, serving_target

    cfg.serving.host, cfg.serving.port = "127.0.0.1", free_port()
    cfg.serving.target = f"127.0.0.1:{cfg.serving.port}"  # the trainer pushes only to a configured target
    cfg.serving.push_token = "group-push-token"
    cfg.trainer.push_snapshots = True
    path = tmp_path / "serving.toml"
    path.write_text(tomli_w.dumps(cfg.to_dict()))
    log = open(tmp_path / "serving.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--config", str(path)], stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    client = ServingClient(serving_target(cfg.serving), push_token=cfg.serving.push_token)
    client.wait_ready(timeout=60)
    return proc, client


def _start_until_stopped(cfg, tmp_path, bootstrap, events: int, output) -> subprocess.Popen:
    """``events`` produced, then a 2-rank ``streamrec train`` on them that runs until it is stopped; its
    stdout and stderr go to ``output`` (text)."""
    from tests.helpers.trainer import produce

    cfg.trainer.idle_exit_s = 0.0
    produce(cfg, bootstrap, events)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen([sys.executable, "-m", "streamrec", "train", "--nproc", "2", "--config", str(cfg_path),
                             "--bootstrap", bootstrap, "--no-progress"], env=env, stdout=output, stderr=output,
                            text=True)


# eleven launches of the killed group, then the clean group's and the 3-rank resume's: the limit is above the sum
# of its own waits (600 s for the killed group, 400 s each for the clean group and the 3-rank resume, 60 s for
# serving to come up)
@pytest.mark.timeout(1560)
@pytest.mark.xdist_group(HEAVY_GROUP)
def test_group_killed_at_ten_points_trains_every_event(topics, tmp_path, bootstrap):
    """Also pushes its snapshots to a real serving endpoint: kills mid-snapshot (rank 1 while its rows are on
    the way to rank 0; rank 0 while it builds) never leave serving with part of a version."""
    cfg = _group_cfg(topics, tmp_path)
    serving, client = _start_serving(cfg, tmp_path)
    n_events = 100_000
    sent = _produce_backlog(cfg, bootstrap, n_events)
    res = _train(cfg, tmp_path, bootstrap, 2, {"STREAMREC_FAILPOINTS": _failpoints()}, timeout=600)
    assert res.returncode == 0, res.stderr[-6000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["reason"] == "idle" and summary["world"] == 2

    trained, launches = _trained(tmp_path, 2)
    assert launches == len(KILLS) + 1, f"{launches} launches: not every failpoint was reached"
    assert "exitcode: -9" in res.stderr  # torchrun names the rank that died, and how
    ends = _ends(bootstrap, cfg.kafka.events_topic, sent)
    for p, end in ends.items():  # every record of every partition trained at least once
        missing = [o for o in range(end) if trained[(p, o)] == 0]
        assert not missing, f"partition {p}: offsets {missing[:5]} never trained"
    dup_events = sum(c - 1 for c in trained.values() if c > 1) * PER_MESSAGE
    # each restart re-trains at most what followed the last manifest: one interval, plus the window in hand
    per_restart = CKPT_EVERY + 2 * BS * cfg.trainer.window_batches + PER_MESSAGE * len(ends)
    assert dup_events <= len(KILLS) * per_restart, (dup_events, per_restart)

    state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    assert state["world"] == 2 and {p: o for _t, p, o in state["offsets"]} == ends
    from streamrec.trainer.group import batch_mode

    assert {k: state[k] for k in ("group_batch", "rank_batch", "global_batch")} == batch_mode(cfg.trainer, 2)
    assert _committed(bootstrap, cfg, ends) == ends  # rank 0 committed every partition after the manifest
    assert state["events"] >= n_events
    log = read_jsonl(tmp_path / "metrics.jsonl")
    # the group measures a progressive AUC of 0.74 on these events (a clean group 0.739; the killed one is held
    # within 0.01 of it below; Bayes-optimal 0.84): the floor is 0.06 below it
    assert log[-1]["auc"] > 0.68, log[-1]
    snaps = sorted(Path(cfg.trainer.snapshot_dir).glob("v*/manifest.json"))
    assert snaps, "no snapshot was built"
    # serving holds the group's newest snapshot, and it is the whole model: rows of both ranks' shards
    import pyarrow.parquet as pq

    from streamrec.trainer.sharding import owner_of

    status = client.status()
    newest = json.loads(snaps[-1].read_text())
    assert int(status["newest_version"]) == newest["version"], (status, newest["version"])
    if int(status["version"]) != newest["version"]:
        # held by the guard, which is not under test here (eleven launches' windows are short and uneven); an
        # operator's accept serves it
        assert status["held_reason"], status
        client.accept(newest["version"])
        status = client.status()
    assert int(status["version"]) == newest["version"], (status, newest["version"])
    stored = 0  # every row the group's shards hold at the final checkpoint
    from streamrec.embedding_store import EmbeddingStore, StoreSpec
    from streamrec.trainer.reshard import rank_dir

    for r in range(2):
        shard = rank_dir(cfg.trainer.checkpoint_dir, r) / latest_checkpoint(cfg.trainer.checkpoint_dir).name / "store"
        ro = EmbeddingStore(StoreSpec(str(shard), tables={f: cfg.model.embedding_dim for f in cfg.model.field_names},
                                      shards=cfg.store.shards, read_only=True))
        stored += sum(len(ids) for _t, ids, _r in ro.export_records())
        ro.close()
    assert int(status["rows_held"]) == stored, (status["rows_held"], stored)
    owners = set()
    for rows_file in snaps[-1].parent.glob("rows-*.parquet"):
        t = pq.read_table(rows_file)
        for table in set(t.column("table").to_pylist()):
            ids = np.asarray([i for tb, i in zip(t.column("table").to_pylist(), t.column("id").to_pylist()) if tb == table])
            owners |= set(np.unique(owner_of(table, ids, 2)).tolist())
    assert owners == {0, 1}
    events = SyntheticStream(cfg).batches(16)
    scores, version = client.predict(next(events).to_events())
    assert version == newest["version"] and np.isfinite(scores).all()
    client.close()
    serving.terminate()
    serving.wait(30)

    # a group never killed, on the same records, ends in the same place (within online-learning noise)
    import copy

    clean = copy.deepcopy(cfg)
    clean.kafka.trainer_group += "-clean"
    clean.trainer.checkpoint_dir, clean.store.path = str(tmp_path / "clean-ckpt"), str(tmp_path / "clean-store")
    clean.trainer.log_path, clean.trainer.trace_path = str(tmp_path / "clean.jsonl"), ""
    clean.trainer.push_snapshots, clean.trainer.snapshot_every = False, 0
    clean.trainer.idle_exit_s = SETTLED_IDLE_EXIT_S
    res_clean = _train(clean, tmp_path / "clean", bootstrap, 2, timeout=400)
    assert res_clean.returncode == 0, res_clean.stderr[-4000:]
    clean_state, _ = read_checkpoint(latest_checkpoint(clean.trainer.checkpoint_dir))
    assert clean_state["events"] == state["events"]
    clean_auc = read_jsonl(tmp_path / "clean.jsonl")[-1]["auc"]
    assert abs(clean_auc - log[-1]["auc"]) <= 0.01, (clean_auc, log[-1]["auc"])

    # the same checkpoint, resumed by 3 ranks: resharded, and training goes on from the same offsets
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(8192):
        prod.send_batch(b)
    prod.close()
    more = prod.sent_messages
    cfg.kafka.partitions = 4
    cfg.trainer.idle_exit_s = SETTLED_IDLE_EXIT_S
    res3 = _train(cfg, tmp_path, bootstrap, 3, timeout=400)
    assert res3.returncode == 0, res3.stderr[-6000:]
    state3, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    ends3 = _ends(bootstrap, cfg.kafka.events_topic, sent + more)
    assert state3["world"] == 3 and {p: o for _t, p, o in state3["offsets"]} == ends3
    assert state3["events"] == state["events"] + 8192  # the new events, once each: nothing re-read


def test_fewer_partitions_than_ranks_is_refused_before_start(bootstrap, tmp_path, cfg):
    import uuid

    cfg.kafka.events_topic = f"narrow-{uuid.uuid4().hex[:8]}"
    cfg.kafka.partitions = 1
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    cfg.trainer.idle_exit_s = 1.0
    res = _train(cfg, tmp_path, bootstrap, 3, timeout=120)
    assert res.returncode == 2
    assert "has 1 partition(s); a group of 3 trainer ranks needs at least 3" in res.stderr
    assert "starting 3 ranks" not in res.stderr


def test_sigterm_drains_the_group_with_a_final_checkpoint(topics, tmp_path, bootstrap):
    import signal

    cfg = _group_cfg(topics, tmp_path)
    cfg.trainer.checkpoint_every_events = 10**9
    proc = _start_until_stopped(cfg, tmp_path, bootstrap, 16_000, subprocess.PIPE)
    deadline = time.monotonic() + 120
    while sum(r.get("events", 0) for r in read_jsonl(tmp_path / "trace.jsonl.rank0") if "ranges" in r) \
            + sum(r.get("events", 0) for r in read_jsonl(tmp_path / "trace.jsonl.rank1") if "ranges" in r) < 16_000:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the group did not train the backlog"
        time.sleep(0.2)
    assert latest_checkpoint(cfg.trainer.checkpoint_dir) is None  # nothing written yet: the drain writes it
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-4000:]
    assert "stopped by signal 15" in err
    assert "forcefully exiting" not in err, err[-4000:]  # each rank exited after its drain, none was killed
    state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    assert state["events"] == 16_000 and state["world"] == 2
    ends = {p: o for _t, p, o in state["offsets"]}
    assert _committed(bootstrap, cfg, ends) == ends


def test_the_ranks_and_their_fork_server_die_with_a_killed_agent(topics, tmp_path, bootstrap):
    """The ranks are children of a fork server, not of the agent (streamrec/app/rank_entry.py): kill -9 of the
    agent still ends every one of them, so no rank trains on beside the group a restart starts."""
    import signal

    import psutil

    proc = _start_until_stopped(_group_cfg(topics, tmp_path), tmp_path, bootstrap, 4_000, subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not all(read_jsonl(tmp_path / f"trace.jsonl.rank{r}") for r in range(2)):  # both ranks are running
        assert proc.poll() is None and time.monotonic() < deadline, "the group did not start"
        time.sleep(0.2)
    family = psutil.Process(proc.pid).children(recursive=True)
    assert len(family) >= 3, family  # the fork server and two ranks (and multiprocessing's resource tracker)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, [p.cmdline()[:4] for p in alive]
