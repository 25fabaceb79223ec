"""The crash-loop breaker: a record that kills the trainer (here a segfault while it is
decoded) does not kill the restarted trainer. The restart probes the records that were
in flight in a child process, quarantines the one that kills it to the DLQ with the
reason, and trains every other event. A death in a training step is pinned the same way (the
real trainer process: tests/trainer/test_crash_pinned_first_death.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import tomli_w

from streamrec.ingest import REASON_HEADER, EventProducer, EventSchema, SyntheticStream, read_topic
from tests.helpers.crash import CRASH_MARK, install_crash_hook
from tests.helpers.ingest import poll_events

pytestmark = pytest.mark.subprocess

@pytest.mark.timeout(660)  # above its own waits: two trainer runs of up to 300 s each
def test_a_record_that_crashes_the_decoder_is_quarantined_by_the_next_start(topics, tmp_path, bootstrap):
    cfg = topics
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 128, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 256, 600.0
    t.hot_source, t.snapshot_every, t.log_every_s = "none", 0, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.codec, cfg.kafka.partitions = "assign", "json", 1
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    env = install_crash_hook(tmp_path / "hook")

    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    good = 0
    for i, b in enumerate(SyntheticStream(cfg).batches(1200)):
        prod.send_batch(b)
        good += len(b)
        if i == 0:  # a contract-valid event whose request id kills the decoder
            ev = b.to_events()[0]
            ev["request_id"] = CRASH_MARK
            prod.send_raw(json.dumps(ev).encode())
    prod.close()

    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--idle-exit", "2", "--no-progress"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "died while decoding records" in second.stderr
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["events"] == good  # every good event, none lost to the crash
    dlq = read_topic(bootstrap, cfg.kafka.dlq_topic, expected=1)
    reasons = [dict(r.headers).get(REASON_HEADER, b"").decode() for r in dlq]
    assert len(dlq) == 1 and reasons[0].startswith("crashed the consumer"), reasons
    assert b"crash-me" in dlq[0].value


@pytest.mark.parametrize("deaths_before", [0, 1])
def test_records_in_flight_at_two_training_deaths_are_quarantined(topics, tmp_path, bootstrap, deaths_before):
    """Records handed to the trainer when it died: the first death is retried (it may have been an
    operator's kill -9), at the second they are quarantined together."""
    from streamrec.ingest import EventConsumer
    from streamrec.ingest.inflight import TRAIN, InflightMarker, InflightRange

    cfg = topics
    cfg.kafka.codec, cfg.kafka.partitions = "json", 1
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(100):
        prod.send_batch(b)
    prod.close()
    marker = tmp_path / "inflight.json"
    topic = cfg.kafka.events_topic
    parts = sorted({r.partition for r in read_topic(bootstrap, topic, expected=100)})
    InflightMarker(marker).mark(TRAIN, [InflightRange(topic, parts[0], 0, 3)], deaths=deaths_before)
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      group_id=f"g-{topic}", mode="assign", inflight_path=marker)
    try:
        got = sum(len(b) for b in poll_events(c, 100 - (4 if deaths_before else 0), timeout=30, max_events=10_000))
        if deaths_before:
            assert got == 96 and c.stats.quarantined == 4
            c.flush_dead_letters()
            dlq = read_topic(bootstrap, cfg.kafka.dlq_topic, expected=4)
            assert sorted(int(dict(r.headers)["streamrec-source"].decode().rsplit(":", 1)[1]) for r in dlq) == [0, 1, 2, 3]
            assert all(dict(r.headers)[REASON_HEADER].startswith(b"crashed the consumer") for r in dlq)
        else:
            assert got == 100 and c.stats.quarantined == 0
            # had it died while training them, the next start would see a second death
            assert json.loads(marker.read_text())["deaths"] == 1
    finally:
        c.close()
    assert not marker.exists()  # a clean stop leaves nothing in flight


@pytest.mark.parametrize("deaths_before", [0, 1])
def test_records_of_a_training_step_that_died_are_probed_then_quarantined(topics, tmp_path, bootstrap, deaths_before):
    """A death in a training step: the marker names exactly the step's records. At the first death the
    consumer hands the re-read ones to the trainer's probe and dead-letters only those it pins; at a later
    death holding them again, all of them."""
    from streamrec.ingest import STEP_CRASH_REASON, EventConsumer
    from streamrec.ingest.inflight import STEP, InflightMarker, InflightRange

    cfg = topics
    cfg.kafka.codec, cfg.kafka.partitions = "json", 1
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(100):
        prod.send_batch(b)
    prod.close()
    marker = tmp_path / "inflight.json"
    topic = cfg.kafka.events_topic
    part = sorted({r.partition for r in read_topic(bootstrap, topic, expected=100)})[0]
    # a step of records 2, 3 and 7 (not contiguous: the merge and the batcher reorder)
    InflightMarker(marker).mark(STEP, [InflightRange(topic, part, 2, 3), InflightRange(topic, part, 7, 7)],
                                deaths=deaths_before)
    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      group_id=f"g-{topic}", mode="assign", inflight_path=marker)
    probed: list = []

    def probe(values):  # the trainer's probe: here, the second record of those re-read kills a training step
        probed.append(len(values))
        return [1]

    c.step_probe = probe
    try:
        assert c.suspect_step() is not None
        want = 99 if deaths_before == 0 else 97
        got = sum(len(b) for b in poll_events(c, want, timeout=30, max_events=10_000))
        assert got == want
        c.flush_dead_letters()
        dlq = read_topic(bootstrap, cfg.kafka.dlq_topic, expected=100 - want)
        sources = sorted(int(dict(r.headers)["streamrec-source"].decode().rsplit(":", 1)[1]) for r in dlq)
        reasons = {dict(r.headers)[REASON_HEADER].decode() for r in dlq}
        if deaths_before == 0:
            assert probed == [3] and sources == [3] and reasons == {STEP_CRASH_REASON}
        else:
            assert probed == [] and sources == [2, 3, 7]
            assert all(x.startswith("crashed the trainer: 2 processes died in training steps") for x in reasons)
        assert c.stats.quarantined == 100 - want
    finally:
        c.close()
    assert not marker.exists()
