"""A record that crashes a training step (not its decoder) is pinned at the first death.

Events carry their Kafka record (partition, offset) through the partition merge and the batcher,
the crash-loop marker written before each step names exactly that step's records, and the restart
trains them one by one in a child process and dead-letters exactly the ones that kill it: whether
Kafka delivers them again or they were restored, waiting, from the checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from streamrec.foundation import EventBatch
from streamrec.ingest import REASON_HEADER, SOURCE_HEADER, EventProducer, EventSchema, SyntheticStream, read_topic
from streamrec.ingest.inflight import STEP, InflightMarker, exact_runs
from streamrec.trainer.batching import EventBatcher
from streamrec.trainer.merge import PartitionMerger
from tests.conftest import small_config

STEP_CRASH_DENSE = 4242.0  # an event whose first dense feature is this kills the training step that holds it

_HOOK = textwrap.dedent('''
    # The stand-in for a native crash in training: any process that trains a mini-batch holding an event
    # whose first dense feature is STREAMREC_TEST_STEP_CRASH segfaults (decoding it is harmless).
    import importlib.abc, importlib.util, os, signal, sys

    _MARK = float(os.environ.get("STREAMREC_TEST_STEP_CRASH", "nan"))

    class _PatchStep(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "streamrec.trainer.fused_step":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None:
                return None
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                real = module.FusedStep.run

                def crashing_run(self, prepared, *a, **k):
                    batch = prepared.batch
                    if batch.dense.shape[1] and (batch.dense[:, 0] == _MARK).any():
                        os.kill(os.getpid(), signal.SIGSEGV)
                    return real(self, prepared, *a, **k)

                module.FusedStep.run = crashing_run

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchStep())
''')


def install_step_crash_hook(folder: Path, env: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_HOOK)
    return dict(env, PYTHONPATH=str(folder), STREAMREC_TEST_STEP_CRASH=str(STEP_CRASH_DENSE))


def _events(cfg, n: int, parts: np.ndarray, offs: np.ndarray) -> EventBatch:
    b = next(SyntheticStream(cfg).batches(n))
    b = b.take(np.arange(n))
    b.source_partitions, b.source_records = parts.astype(np.int32), offs.astype(np.int64)
    return b


def test_merge_and_batcher_carry_each_events_record_through_reordering_and_a_restore(tmp_path):
    cfg = small_config(tmp_path)
    n = 300
    parts = np.arange(n) % 3
    offs = 1000 * parts + np.arange(n) // 3
    b = _events(cfg, n, parts, offs)
    b.ts = np.where(parts == 0, 10 * np.arange(n), np.arange(n)).astype(np.int64)  # partition 0 runs ahead: reordered
    src = {int(t): (int(p), int(o)) for t, p, o in zip(b.ts, parts, offs)}
    assert len(src) == n
    m = PartitionMerger(1000.0, 10_000, cfg.model.dense_dim, cfg.model.field_names, clock=lambda: 0.0)
    m.expect([0, 1, 2])
    m.add(b, now=0.0)
    out = m.release(now=0.0)
    assert out is not None and 0 < len(out) < n  # some wait in the merge
    m2 = PartitionMerger(1000.0, 10_000, cfg.model.dense_dim, cfg.model.field_names, clock=lambda: 0.0)
    m2.load_state(m.state())  # restored from a checkpoint: the sources come back too
    rest = m2.drain()
    assert not np.array_equal(np.concatenate([out.ts, rest.ts]), b.ts)  # the merge did reorder
    bt = EventBatcher(64, 128, cfg.model.dense_dim, cfg.model.field_names)
    steps = bt.add(out, None)
    restored = EventBatcher(64, 128, cfg.model.dense_dim, cfg.model.field_names)
    restored.load_state(bt.state())
    steps2 = restored.add(rest, None) + restored.drain()
    seen = 0
    for holder, ss in ((bt, steps), (restored, steps2)):
        for s in ss:
            for t, p, o in zip(holder.buffer.ts[s.rows], holder.part[s.rows], holder.off[s.rows]):
                assert src[int(t)] == (int(p), int(o))
                seen += 1
        if holder is bt:
            bt.retire()
    assert seen == n


def test_a_batcher_removes_restored_events_and_still_forms_steps_of_the_rest(tmp_path):
    cfg = small_config(tmp_path)
    b = _events(cfg, 50, np.zeros(50), np.arange(50))
    bt = EventBatcher(64, 128, cfg.model.dense_dim, cfg.model.field_names)
    assert bt.add(b, None) == []
    gone = bt.remove(np.array([3, 17]))
    assert gone.source_records.tolist() == [3, 17] and len(bt) == 48
    steps = bt.drain()
    trained = np.concatenate([bt.off[s.rows] for s in steps])
    assert sorted(trained.tolist()) == [o for o in range(50) if o not in (3, 17)]


def test_the_marker_before_each_step_names_exactly_the_records_it_trains(tmp_path):
    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.trainer import TrainerCore

    cfg = small_config(tmp_path)
    cfg.trainer.batch_size, cfg.trainer.window_batches, cfg.trainer.device = 32, 2, "cpu"
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, "cpu", store_cfg=cfg.store, join=cfg.join)
    marker = InflightMarker(tmp_path / "inflight.json")
    marks: list = []
    trained: list = []

    class StepMarker:  # what the consumer does, on a real marker file
        def mark_step(self, parts, offs):
            marker.mark_runs(STEP, "events", exact_runs(parts, offs))
            marks.append({(int(p), int(o)) for p, o in zip(parts, offs)})

        def step_done(self):
            marker.idle()

    real_step = core._step

    def step(sub, prepared, *ahead):  # the records of the step that runs, told apart by their ts
        trained.append({by_ts[int(t)] for t in sub.ts})
        phase, ranges, _ = InflightMarker(tmp_path / "inflight.json").found  # what a restart would read
        assert phase == STEP
        assert {(r.partition, o) for r in ranges for o in range(r.first, r.last + 1)} == trained[-1]
        return real_step(sub, prepared, *ahead)

    core._step = step
    core.step_marker = StepMarker()
    n = 200
    parts = np.arange(n) % 2
    offs = 7 * np.arange(n) + parts  # not contiguous: every range in the marker is exact
    b = _events(cfg, n, parts, offs)
    b.ts = np.arange(n, dtype=np.int64)
    by_ts = {int(t): (int(p), int(o)) for t, p, o in zip(b.ts, parts, offs)}
    try:
        core.feed(_with_sources(b, np.arange(100)))
        core.feed(_with_sources(b, np.arange(100, n)), flush=True)
    finally:
        store.close()
    assert len(trained) >= 6 and marks == trained  # one mark per step, naming exactly its records
    assert set().union(*trained) == set(by_ts.values())
    assert InflightMarker(tmp_path / "inflight.json").found is None  # no step runs: a later death blames none


def _with_sources(b: EventBatch, rows: np.ndarray) -> EventBatch:
    out = b.take(rows)
    out.source_partitions, out.source_records = b.source_partitions[rows], b.source_records[rows]
    return out


@pytest.mark.subprocess
def test_the_probe_pins_the_one_event_that_kills_a_training_step(tmp_path, monkeypatch):
    from streamrec.trainer import probe_train
    from streamrec.trainer.crash_probe import ProbeModel

    cfg = small_config(tmp_path)
    b = _events(cfg, 40, np.zeros(40), np.arange(40))
    b.dense[13, 0] = STEP_CRASH_DENSE
    env = install_step_crash_hook(tmp_path / "hook", {})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert probe_train(ProbeModel(cfg.model, cfg.trainer, cfg.store), None, b) == [13]
    b.dense[13, 0] = 0.0
    assert probe_train(ProbeModel(cfg.model, cfg.trainer, cfg.store), None, b) == []  # nothing kills it: nothing pinned


@pytest.mark.subprocess
@pytest.mark.timeout(900)  # two trainer runs of up to 300 s each, and the probe
def test_a_record_that_kills_a_training_step_after_waiting_in_the_merge_is_dead_lettered_at_the_first_death(
        topics, tmp_path, bootstrap):
    cfg = topics
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 64, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 128, 600.0
    t.hot_source, t.snapshot_every, t.log_every_s = "none", 0, 600.0
    t.merge_wait_ms = 5000.0
    t.trace_path = str(tmp_path / "trace.jsonl")
    cfg.kafka.consumer_mode, cfg.kafka.codec = "assign", "json"
    topic = cfg.kafka.events_topic
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    env = install_step_crash_hook(tmp_path / "hook", dict(__import__("os").environ))

    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    good = 0
    for i, b in enumerate(SyntheticStream(cfg).batches(900)):
        prod.send_batch(b)
        good += len(b)
        if i == 0:  # a contract-valid event that kills the step training it; its ts holds it in the merge
            ev = b.to_events()[0]
            ev["dense"][0] = STEP_CRASH_DENSE
            ev["ts"] = int(b.ts.max()) + 3_600_000
            prod.send_raw(json.dumps(ev).encode())
    prod.close()
    recs = read_topic(bootstrap, topic, expected=good + 1)
    assert len({r.partition for r in recs}) >= 2  # the merge has partitions to hold it against
    crash = [r for r in recs if json.loads(r.value)["dense"][0] == STEP_CRASH_DENSE]
    assert len(crash) == 1
    crash_p, crash_o = crash[0].partition, crash[0].offset

    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--idle-exit", "3", "--no-progress"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == -signal.SIGSEGV, first.stderr[-3000:]
    phase, ranges, deaths = InflightMarker(Path(t.checkpoint_dir) / "inflight.json").found
    named = {(r.partition, o) for r in ranges for o in range(r.first, r.last + 1)}
    assert phase == STEP and deaths == 0
    assert (crash_p, crash_o) in named and len(named) > 1  # the step held other records too
    # it waited: a checkpoint holding offsets past it was written before the death (it is restored, waiting)
    trace = [json.loads(x) for x in Path(t.trace_path).read_text().splitlines()]
    ckpt_offsets = [dict(((tt, p), o) for tt, p, o in x["offsets"]) for x in trace if "checkpoint" in x]
    assert any(o.get((topic, crash_p), -1) > crash_o for o in ckpt_offsets), ckpt_offsets

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "running a training step on" in second.stderr
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["events"] == good  # every other event trained, none lost to the crash
    dlq = read_topic(bootstrap, cfg.kafka.dlq_topic, expected=1, timeout=15)
    assert len(dlq) == 1, [dict(r.headers) for r in dlq]
    h = dict(dlq[0].headers)
    assert h[SOURCE_HEADER].decode() == f"{topic}:{crash_p}:{crash_o}"
    assert h[REASON_HEADER].decode().startswith("crashed the trainer: the process died in a training step")
    assert json.loads(dlq[0].value)["dense"][0] == STEP_CRASH_DENSE
    assert not (Path(t.checkpoint_dir) / "inflight.json").exists()


def test_each_decoded_event_names_its_record_arrow_records_holding_many(tmp_path):
    """The consumer's per-event record offsets: one JSON event per record, an Arrow record's rows all
    naming that record, records that failed to decode naming nothing."""
    from types import SimpleNamespace

    from streamrec.ingest import Decoder, EventSchema, encode_messages
    from streamrec.ingest.fast_records import RecordRun
    from streamrec.ingest.kafka_io import _record_offsets

    cfg = small_config(tmp_path)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    b = next(SyntheticStream(cfg).batches(8)).take(np.arange(8))
    arrow = encode_messages(b, schema, "arrow", 5)  # 2 records: 5 and 3 events
    one = encode_messages(b.take(np.array([0])), schema, "json", 1)[0]
    values = [arrow[0], b"{not json", one, arrow[1]]
    recs = [SimpleNamespace(topic="events", partition=2, offset=10 + i, value=v) for i, v in enumerate(values)]
    run = RecordRun.of_records(recs)
    got, errors = Decoder(schema).decode_many(values)
    assert [i for i, _ in errors] == [1] and len(got) == 9
    assert _record_offsets(run, values, errors, len(got)).tolist() == [10] * 5 + [12] + [13] * 3
