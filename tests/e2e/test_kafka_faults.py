"""Kafka faults against real brokers: a broker that comes back empty (topic recreated,
offsets lost) and a trainer too slow for its group's poll interval. Nothing is
skipped silently, nothing crashes, nothing is lost."""

from __future__ import annotations

import threading
import time

import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.ingest import (EmbeddedBroker, EventConsumer, EventProducer, EventSchema, OffsetsLostError,
                              SyntheticStream, ensure_topics, free_port, pipeline_topics)
from streamrec.trainer import TrainerService

from tests.conftest import small_config

pytestmark = [pytest.mark.e2e, pytest.mark.broker]


def _cfg(tmp_path, policy: str):
    cfg = small_config(tmp_path, **{"kafka.on_offsets_lost": policy})
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 256, 4, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 512, 600.0
    t.hot_source, t.snapshot_every, t.idle_exit_s, t.log_every_s = "none", 0, 1.5, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message, cfg.kafka.partitions = "assign", 64, 2
    return cfg


def _produce(cfg, bootstrap, n, seed):
    cfg.generator.seed = seed
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(n):
        prod.send_batch(b)
    prod.close()


# the tests that share ``restarted_empty`` run on one xdist worker, so the broker is restarted once
RESTARTED_EMPTY_WORKER = pytest.mark.xdist_group("restarted-empty-broker")


@pytest.fixture(scope="module")
def restarted_empty(tmp_path_factory):
    """Train 2,048 events, then bring the broker back empty with only 384 new events: the broker (kept up for the
    module) and the first run's directory (its store and checkpoints). Each test resumes from a copy of that
    directory (``_resume_dir``), so one test's run never changes what another starts from."""
    first = tmp_path_factory.mktemp("first-run")
    cfg = _cfg(first, "fail")
    port = free_port()
    with EmbeddedBroker(port=port) as broker:
        ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        _produce(cfg, broker.bootstrap, 2048, seed=1)
        summary = TrainerService(trainer_settings(cfg), broker.bootstrap, progress=False).run()
        assert summary["events"] == 2048
    broker = EmbeddedBroker(port=port).start()
    try:
        ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        _produce(cfg, broker.bootstrap, 384, seed=2)
        yield broker, first
    finally:
        broker.stop()


def _resume_dir(restarted, tmp_path, policy: str):
    """The config of a trainer resuming the first run from a copy of its directory in ``tmp_path``."""
    import shutil

    _broker, first = restarted
    shutil.copytree(first, tmp_path, dirs_exist_ok=True)
    return _cfg(tmp_path, policy)


@RESTARTED_EMPTY_WORKER
def test_a_recreated_topic_stops_the_trainer_with_a_clear_message_by_default(tmp_path, restarted_empty):
    cfg = _resume_dir(restarted_empty, tmp_path, "fail")
    with pytest.raises(OffsetsLostError) as e:
        TrainerService(trainer_settings(cfg), restarted_empty[0].bootstrap, progress=False).run()
    msg = str(e.value)
    assert f"{cfg.kafka.events_topic}[0]" in msg and "expected to resume at offset" in msg
    assert "deleted and recreated" in msg and "kafka.on_offsets_lost=earliest" in msg


@RESTARTED_EMPTY_WORKER
def test_with_earliest_every_event_after_the_restart_is_trained(tmp_path, restarted_empty):
    cfg = _resume_dir(restarted_empty, tmp_path, "earliest")
    summary = TrainerService(trainer_settings(cfg), restarted_empty[0].bootstrap, progress=False).run()
    assert summary["events"] == 2048 + 384  # the resumed counters plus every new event, once


def test_a_broker_that_comes_back_empty_mid_run_is_caught_up_from_the_start(tmp_path):
    """The trainer keeps running while its broker restarts empty: with earliest it trains the new
    log from its first offset (no crash at commit, no silent skip of the first events)."""
    cfg = _cfg(tmp_path, "earliest")
    cfg.trainer.idle_exit_s = 0.0
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    stop = threading.Event()
    svc = None
    out: dict = {}
    try:
        ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        _produce(cfg, broker.bootstrap, 1024, seed=1)
        svc = TrainerService(trainer_settings(cfg), broker.bootstrap, stop=stop, progress=False)
        th = threading.Thread(target=lambda: out.update(svc.run()), daemon=True)
        th.start()
        deadline = time.monotonic() + 60
        while svc.core.events < 1024 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc.core.events == 1024
        broker.stop()
        broker = EmbeddedBroker(port=port).start()
        ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        _produce(cfg, broker.bootstrap, 320, seed=2)  # fewer than before: the old positions are past the end
        deadline = time.monotonic() + 90
        while svc.core.events < 1024 + 320 and time.monotonic() < deadline and th.is_alive():
            time.sleep(0.2)
        assert th.is_alive(), out
        if svc.core.events != 1024 + 320:  # say where the consumer stands
            from kafka import TopicPartition

            c = svc.consumer
            tps = [TopicPartition(cfg.kafka.events_topic, p) for p in range(cfg.kafka.partitions)]
            where = {"next": c._next, "positions": {tp.partition: c.consumer.position(tp) for tp in tps},
                     "ends": c.consumer.end_offsets(tps), "paused": c.consumer.paused(), "pending": len(c._pending)}
            pytest.fail(f"trained {svc.core.events} of {1024 + 320}: {where}")
        assert svc.consumer.stats.offsets_reset >= 1
    finally:
        stop.set()
        if svc is not None:
            th.join(30)
        broker.stop()


def test_a_consumer_slower_than_its_poll_interval_rejoins_and_loses_or_repeats_nothing(tmp_path, bootstrap, topics):
    """Group mode, a poll interval of 6 s and a caller that stalls 9 s between polls: the member is
    dropped, its commit fails, it rejoins and resumes where it handed records out."""
    cfg = topics
    cfg.kafka.events_per_message = 32
    _produce(cfg, bootstrap, 640, seed=3)
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      group_id=f"slow-{cfg.kafka.events_topic}", mode="group",
                      max_poll_interval_ms=6000, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    try:
        got = 0
        deadline = time.monotonic() + 120
        stalled = False
        while got < 640 and time.monotonic() < deadline:
            b = c.poll_batch(96, timeout=1.0)
            if b is None:
                continue
            got += len(b)
            if not stalled and got >= 192:
                time.sleep(9)  # longer than max.poll.interval: the group drops this member
                stalled = True
                c.mark_durable(dict(b.source_offsets))  # fails (not a member): must not raise
        assert got == 640  # every event once: nothing lost, nothing handed out twice
        assert c.stats.commit_failures + c.stats.rebalances >= 1
    finally:
        c.close()


def test_a_trainer_slower_than_its_poll_interval_stays_correct(topics, tmp_path, bootstrap, monkeypatch):
    """Group mode, max.poll.interval 6 s, and one window that takes 9 s to train: the trainer is dropped
    from its group and its commit fails, but it neither crashes nor loses, skips or repeats an event."""
    from streamrec.trainer import TrainerCore

    cfg = _cfg(tmp_path, "fail")
    cfg.kafka = topics.kafka
    cfg.kafka.consumer_mode, cfg.kafka.max_poll_interval_ms = "group", 6000
    cfg.kafka.events_per_message = 64
    cfg.trainer.checkpoint_every_events, cfg.trainer.idle_exit_s = 256, 4.0
    _produce(cfg, bootstrap, 2048, seed=4)
    real = TrainerCore.feed  # what the service hands each poll's events to
    calls = {"n": 0}

    def slow_window(self, batch, flush=False):
        calls["n"] += 1
        # the first hand-over, with more of the stream to come (a later one may be the partition merge's
        # release of the stream's tail once it goes quiet, after which the trainer only exits idle)
        if calls["n"] == 1:
            time.sleep(9)  # longer than max.poll.interval: the group drops this member
        return real(self, batch, flush)

    monkeypatch.setattr(TrainerCore, "feed", slow_window)
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    summary = svc.run()
    assert summary["events"] == 2048  # every event exactly once
    assert svc.consumer.stats.commit_failures + svc.consumer.stats.rebalances >= 1


def test_a_topic_recreated_with_more_partitions_is_read_in_full(tmp_path):
    """The broker comes back empty and the topic reappears with more partitions than before (recreated by
    hand, or auto-created by a client with the broker's default count): a trainer reading every partition
    (assign mode) takes the new ones too, so no event in them is skipped."""
    import copy

    cfg = _cfg(tmp_path, "earliest")
    cfg.trainer.idle_exit_s = 0.0
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    stop = threading.Event()
    svc, th, out = None, None, {}
    try:
        ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))  # 2 partitions
        _produce(cfg, broker.bootstrap, 512, seed=1)
        svc = TrainerService(trainer_settings(cfg), broker.bootstrap, stop=stop, progress=False)
        th = threading.Thread(target=lambda: out.update(svc.run()), daemon=True)
        th.start()
        deadline = time.monotonic() + 60
        while svc.core.events < 512 and time.monotonic() < deadline:
            time.sleep(0.1)
        broker.stop()
        broker = EmbeddedBroker(port=port).start()
        wider = copy.deepcopy(cfg)
        wider.kafka.partitions = 4
        ensure_topics(broker.bootstrap, pipeline_topics(wider.kafka, wider.trainer.ranks))
        _produce(wider, broker.bootstrap, 512, seed=2)  # 8 messages over 4 partitions
        deadline = time.monotonic() + 60
        while svc.core.events < 1024 and time.monotonic() < deadline and th.is_alive():
            time.sleep(0.2)
        assert th.is_alive(), out
        assert svc.core.events == 1024, (svc.core.events, svc.consumer._next)
        assert svc.consumer.stats.partitions_added == 2
    finally:
        stop.set()
        if th is not None:
            th.join(30)
        broker.stop()
