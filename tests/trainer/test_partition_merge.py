"""Partition order (issue #17): several partitions are merged by event time before training, with a
bounded wait (trainer/merge.py). Unit tests of the merge on a fake clock, then through the real broker:
events produced unevenly to four partitions train in time order, and a stop with events waiting in
the merge loses none and trains none twice after the restart."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.foundation import EventBatch
from streamrec.ingest import SyntheticStream
from streamrec.trainer.merge import PartitionMerger
from tests.conftest import small_config


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _events(cfg, ts, parts) -> EventBatch:
    b = EventBatch.concat(list(SyntheticStream(cfg).batches(len(ts))), cfg.model.dense_dim, cfg.model.field_names)
    b.ts = np.asarray(ts, np.int64)
    b.labels = np.asarray(ts, np.float32)  # a marker: which event is which
    b.source_partitions = np.asarray(parts, np.int32)
    return b


def _merger(cfg, clock, wait_ms=200.0, max_events=10_000):
    return PartitionMerger(wait_ms, max_events, cfg.model.dense_dim, cfg.model.field_names, clock=clock)


def test_partitions_come_out_in_time_order_and_a_quiet_one_stops_holding_the_others_back(tmp_path):
    cfg = small_config(tmp_path)
    clock = Clock()
    m = _merger(cfg, clock)
    m.expect([0, 1, 2])
    # partition 0 delivers its whole backlog first, as a consumer does; 1 and 2 have not delivered yet
    assert m.release(behind={1, 2}) is None
    m.add(_events(cfg, [1, 4, 6, 9], [0] * 4))
    assert m.release(behind={1, 2}) is None  # 1 and 2 have records the consumer has not handed out
    m.add(_events(cfg, [2, 3, 8], [1] * 3))
    assert m.release(behind={2}) is None  # 2 still holds everything back
    m.add(_events(cfg, [5, 7], [2] * 2))
    out = m.release(behind=set())  # every partition delivered recently: the watermark is min newest = 7
    assert list(out.ts) == [1, 2, 3, 4, 5, 6]
    assert list(out.source_partitions) == [0, 1, 1, 0, 2, 0]
    clock.t += 0.1  # 100 ms later: still within the wait
    assert m.release() is None
    clock.t += 0.15  # 250 ms without a delivery: no partition holds, all goes
    assert list(m.release().ts) == [7, 8, 9]
    assert len(m) == 0


def test_a_partition_is_never_reordered_inside_itself_and_one_partition_changes_nothing(tmp_path):
    cfg = small_config(tmp_path)
    clock = Clock()
    m = _merger(cfg, clock)
    m.expect([0, 1])
    m.add(_events(cfg, [5, 3, 4, 10], [0] * 4))  # not monotonic in its partition
    m.add(_events(cfg, [1, 6, 12], [1] * 3))
    out = m.release()  # watermark min(10, 12) = 10: keys of partition 0 are 5, 5, 5, 10
    assert list(out.ts) == [1, 5, 3, 4, 6]
    one = _merger(cfg, clock)
    one.expect([0])
    ts = [5, 3, 9, 4, 4, 20, 1]
    released = []
    for lo in range(0, len(ts), 2):
        one.add(_events(cfg, ts[lo:lo + 2], [0] * len(ts[lo:lo + 2])))
        r = one.release()
        released += list(r.ts) if r is not None else []
    released += list(one.drain().ts)
    assert released == ts  # arrival order, whatever the release boundaries


def test_an_event_waits_at_most_max_events_arrivals(tmp_path):
    cfg = small_config(tmp_path)
    m = _merger(cfg, Clock(), max_events=5)
    m.expect([0, 1])
    m.add(_events(cfg, list(range(8)), [0] * 8))
    out = m.release(behind={1})  # partition 1 never delivered: only the bound releases
    assert list(out.ts) == [0, 1, 2] and m.forced == 3 and len(m) == 5


def test_waiting_events_survive_a_checkpoint_restore_exactly_once(tmp_path):
    """Stopping halfway (state saved, a new merger restored from it) releases the same events, none lost
    and none twice, as running straight through."""
    cfg = small_config(tmp_path)
    rng = np.random.default_rng(0)
    ts = np.arange(3_000)
    parts = rng.choice(4, size=3_000, p=[0.5, 0.3, 0.01, 0.19])
    chunks = [np.flatnonzero(parts == p) for p in range(4)]
    deliveries = [c[lo:lo + 97] for c in chunks for lo in range(0, len(c), 97)]  # partition after partition

    def run(stop_at=None):
        clock = Clock()
        m = _merger(cfg, clock)
        m.expect(range(4))
        out = []
        for i, rows in enumerate(deliveries):
            if i == stop_at:
                st = m.state()
                m = _merger(cfg, clock)
                m.expect(range(4))
                m.load_state(st)
                assert len(m) > 0  # events were waiting in the merge at the stop
            m.add(_events(cfg, ts[rows], parts[rows]))
            behind = {p for p in range(4) if any(len(d) and parts[d[0]] == p for d in deliveries[i + 1:])}
            r = m.release(behind=behind)
            out += list(r.ts) if r is not None else []
        r = m.drain()
        return out + (list(r.ts) if r is not None else [])

    straight = run()
    assert straight == sorted(straight) and sorted(straight) == list(ts)
    assert run(stop_at=len(deliveries) // 2) == straight


def _produce_unevenly(cfg, bootstrap, n, weights, seed=0):
    """``n`` events with ts 0..n-1 spread over partitions by ``weights`` (each partition in ts order)."""
    from streamrec.foundation import EventSchema
    from streamrec.ingest import EventProducer, encode_messages
    from streamrec.ingest.codec import CODEC_HEADER

    allb = EventBatch.concat(list(SyntheticStream(cfg).batches(n)), cfg.model.dense_dim, cfg.model.field_names)
    allb.ts = np.arange(n, dtype=np.int64) + 1_700_000_000_000
    parts = np.random.default_rng(seed).choice(len(weights), size=n, p=weights)
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    for p in range(len(weights)):
        mine = allb.take(np.flatnonzero(parts == p))
        for m in encode_messages(mine, schema, cfg.kafka.codec, cfg.kafka.events_per_message):
            prod.producer.send(cfg.kafka.events_topic, m, partition=p, headers=[(CODEC_HEADER, cfg.kafka.codec.encode())])
    prod.close()
    return allb.ts


@pytest.fixture
def recorded(monkeypatch):
    """Every event's ts in the order it is handed to training (TrainerCore.feed)."""
    from streamrec.trainer.core import TrainerCore

    fed: list[int] = []
    real = TrainerCore.feed

    def feed(self, batch, flush=False):
        fed.extend(int(x) for x in batch.ts)
        return real(self, batch, flush)

    monkeypatch.setattr(TrainerCore, "feed", feed)
    return fed


def _four_partitions(tmp_path, bootstrap):
    from streamrec.ingest import ensure_topics, pipeline_topics
    from tests.helpers.trainer import stream_cfg

    cfg = stream_cfg(small_config(tmp_path), tmp_path)
    cfg.kafka.events_topic, cfg.kafka.partitions = f"events-{uuid.uuid4().hex[:8]}", 4
    cfg.kafka.dlq_topic, cfg.kafka.events_per_message = cfg.kafka.events_topic + ".dlq", 50
    cfg.trainer.until_end, cfg.trainer.idle_exit_s = True, 30.0
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    return cfg


def test_events_produced_unevenly_to_four_partitions_train_in_time_order(tmp_path, bootstrap, recorded):
    """Through the broker: a backlog spread 45/25/0.2/29.8 % over four partitions trains in ts order with
    the merge on; with it off (the control) it trains partition after partition."""
    from streamrec.trainer.service import TrainerService

    cfg = _four_partitions(tmp_path, bootstrap)
    ts = _produce_unevenly(cfg, bootstrap, 6_000, [0.45, 0.25, 0.002, 0.298])
    out = {}
    for run, wait in (("merged", 300.0), ("off", 0.0)):
        recorded.clear()
        cfg.store.path, cfg.trainer.checkpoint_dir = str(tmp_path / run / "store"), str(tmp_path / run / "ckpt")
        cfg.kafka.trainer_group = f"trainer-{uuid.uuid4().hex[:8]}"
        cfg.trainer.merge_wait_ms = wait
        res = TrainerService(trainer_settings(cfg), bootstrap, progress=False).run()
        assert res["events"] == 6_000 and sorted(recorded) == sorted(ts.tolist()), (run, res)
        inversions = int((np.diff(np.asarray(recorded)) < 0).sum())
        out[run] = inversions
    assert out["merged"] == 0, out
    assert out["off"] >= 2, out  # partition after partition: the order goes back in time at each switch


def test_a_stop_with_events_waiting_in_the_merge_loses_none_and_trains_none_twice(tmp_path, bootstrap, recorded):
    """Stopped (final checkpoint) while the merge holds events, then resumed from that checkpoint: every
    event trains exactly once over the two runs, in time order within each run."""
    import threading

    from streamrec.trainer.service import TrainerService

    cfg = _four_partitions(tmp_path, bootstrap)
    cfg.trainer.merge_wait_ms = 60_000.0  # only the end of the stream (or the stop) releases a held partition
    ts = _produce_unevenly(cfg, bootstrap, 6_000, [0.45, 0.25, 0.002, 0.298], seed=1)
    stop = threading.Event()
    first = TrainerService(trainer_settings(cfg), bootstrap, stop=stop, progress=False)
    real_merge = first._merge
    held = []

    def merge(batch, now):
        r = real_merge(batch, now)
        if len(first.merger) >= 2_000 and not stop.is_set():
            held.append(len(first.merger))
            stop.set()  # the loop ends "stopped" and writes its final checkpoint with these events in it
        return r

    first._merge = merge
    res1 = first.run()
    assert res1["reason"] == "stopped" and held, res1
    part1 = list(recorded)
    recorded.clear()
    res2 = TrainerService(trainer_settings(cfg), bootstrap, progress=False).run()
    part2 = list(recorded)
    assert res2["reason"] == "end of stream" and res2["events"] == 6_000, res2
    assert sorted(part1 + part2) == sorted(ts.tolist())  # none lost, none twice
    assert len(part2) >= held[0]  # the held events were trained after the restart
    assert part1 == sorted(part1) and part2 == sorted(part2)


def test_task_labels_and_feedback_wait_in_the_merge_and_survive_its_checkpoint(tmp_path):
    """Every column of an event travels through the merge with it: the task-label matrix (NaN where a task is
    missing), its task names and the feedback kind, also across a state save and restore."""
    cfg = small_config(tmp_path)
    ts = np.arange(40)
    b = _events(cfg, ts, np.zeros(40, np.int32))
    b.task_labels = np.stack([b.labels, np.where(ts % 3 == 0, 1.0, np.nan)], axis=1).astype(np.float32)
    b.task_names = ("click", "conversion")
    b.feedback = (ts % 4).astype(np.int8)
    clock = Clock()
    m = _merger(cfg, clock)
    m.expect([0, 1])  # partition 1 is silent: partition 0's events wait for it
    m.add(b)
    assert m.release(behind={1}) is None
    again = _merger(cfg, clock)
    again.expect([0, 1])
    again.load_state(m.state())
    out = again.drain()
    np.testing.assert_array_equal(out.task_labels, b.task_labels)  # NaN in the same places
    assert out.task_names == ("click", "conversion")
    np.testing.assert_array_equal(out.feedback, b.feedback)
