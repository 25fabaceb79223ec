"""The trainer consuming the events topic in-process: bad records are dead-lettered while training
goes on, and a stop before any partition is assigned is a clean stop."""

from __future__ import annotations

import json
import threading

from streamrec.app.wiring import trainer_settings
from streamrec.ingest import EventProducer, EventSchema, SyntheticStream, read_topic
from streamrec.trainer.service import TrainerService
from tests.helpers.trainer import produce, read_jsonl, stream_cfg, trainer_cfg


def test_bad_records_are_dead_lettered_and_training_goes_on(topics, tmp_path, bootstrap):
    from streamrec.trainer.service import TrainerService

    cfg = trainer_cfg(topics, tmp_path)
    cfg.trainer.snapshot_every = 0
    cfg.trainer.idle_exit_s = 2.0
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    good = 0
    for i, b in enumerate(SyntheticStream(cfg).batches(6_000)):
        prod.send_batch(b)
        good += len(b)
        prod.send_raw(b"\x00not an event")
        prod.send_raw(json.dumps({"ts": 1, "label": 1, "dense": [1.0], "sparse": {}}).encode())  # wrong width
    prod.close()
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    summary = svc.run()
    assert summary["events"] == good
    assert summary["dead_letters"] >= 2 and summary["dead_letters"] % 2 == 0
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert last["dead_letters"] == summary["dead_letters"]
    assert len(read_topic(bootstrap, cfg.kafka.dlq_topic, expected=summary["dead_letters"])) == summary["dead_letters"]


def test_stop_while_waiting_for_partitions_exits_as_stopped(topics, tmp_path, bootstrap):
    """SIGTERM (the stop event) while the group join is still pending is a clean stop (reason "stopped",
    nothing trained, no checkpoint), not RuntimeError("no partitions ... assigned") and exit 1."""
    cfg = stream_cfg(topics, tmp_path)
    cfg.kafka.consumer_mode = "group"
    stop = threading.Event()
    stop.set()  # the signal arrived before the group assigned anything
    svc = TrainerService(trainer_settings(cfg), bootstrap, stop=stop, progress=False)
    summary = svc.run()
    assert summary["reason"] == "stopped" and summary["events"] == 0 and summary["checkpoint"] == 0


def test_a_fetch_that_keeps_known_records_back_is_not_the_end_of_the_stream(topics, tmp_path, bootstrap):
    """The idle exit counts only while no fetch shows records left to read: a reader that knows of unread
    records but hands none out for longer than ``trainer.idle_exit_s`` (a loaded host, a saturated link) does
    not end the run; once they come, every event trains and the quiet stream then ends it."""
    import time

    cfg = stream_cfg(topics, tmp_path)
    cfg.trainer.idle_exit_s = 1.0
    produce(cfg, bootstrap, 3_000)
    svc = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    poll, behind, began = svc.consumer.poll_batch, svc.consumer.fetch_behind, []

    def stalled() -> bool:  # the first 3 s: the fetch's high watermark is known, its records are not here yet
        began or began.append(time.monotonic())
        return time.monotonic() - began[0] < 3.0

    def slow_poll(*args, **kwargs):
        if stalled():
            time.sleep(0.1)
            return None
        return poll(*args, **kwargs)

    svc.consumer.poll_batch = slow_poll
    svc.consumer.fetch_behind = lambda: stalled() or behind()
    summary = svc.run()
    assert summary["reason"] == "idle" and summary["events"] == 3_000, summary
