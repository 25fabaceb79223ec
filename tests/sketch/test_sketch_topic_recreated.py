"""A running sketch worker whose events topic is deleted and recreated: a real embedded broker, a real
`streamrec sketch` process. The worker reads the topic's id again while it runs and applies
``kafka.on_offsets_lost`` as the trainer does: ``earliest`` counts the new topic afresh from its start
(the hot set's counts are the new topic's events only) with one warning line; ``fail`` stops with one
line naming the partitions and how to go on, no traceback."""

from __future__ import annotations

import time

import pytest

from streamrec.sketch import HotSetFollower
from tests.helpers.sketch import produce_events, start_worker, stop_worker, write_config
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]


def _topic_id(bootstrap: str, topic: str) -> str | None:
    """The topic's id as a fresh client sees it (None while it does not exist)."""
    from kafka import KafkaConsumer

    from streamrec.ingest import topic_id

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        if topic not in c.topics():
            return None
        tid = topic_id(c, topic)
        return str(tid) if tid is not None else None
    finally:
        c.close()


def _recreate(bootstrap: str, cfg) -> tuple[str, str]:
    """Delete the events topic, wait until it is gone, create it again; returns (old id, new id)."""
    from kafka.admin import KafkaAdminClient

    from streamrec.ingest import ensure_topics
    from streamrec.ingest.broker import TopicSpec

    topic = cfg.kafka.events_topic
    old = _topic_id(bootstrap, topic)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    wait_until(lambda: _topic_id(bootstrap, topic) is None, 30, f"{topic} deleted", interval=0.3)
    ensure_topics(bootstrap, [TopicSpec(topic, cfg.kafka.partitions)])
    new = wait_until(lambda: _topic_id(bootstrap, topic), 30, f"{topic} recreated", interval=0.3)
    assert old and new != old
    return old, new


def _scrape(port: int, name: str) -> float | None:
    """One sample of the worker's ``/metrics`` (Prometheus text, parsed by prometheus_client)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name:
                return sample.value
    return None


def _cfg(topics, policy: str):
    cfg = topics
    cfg.kafka.on_offsets_lost = policy
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7
    return cfg


@pytest.mark.timeout(300)
def test_with_earliest_a_recreated_topic_is_counted_afresh_from_its_start(topics, bootstrap, tmp_path):
    from streamrec.ingest import free_port

    cfg = _cfg(topics, "earliest")
    cfg.sketch.metrics_port = free_port()
    n1, n2 = 3000, 1200
    produce_events(cfg, bootstrap, n1, seed=1)
    log = tmp_path / "worker.log"
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(write_config(cfg, tmp_path / "sketch.toml"), bootstrap, log)
    try:
        hs = follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n1)
        assert hs is not None, f"no hot set of the first {n1} events; log:\n{log.read_text()[-3000:]}"

        old, new = _recreate(bootstrap, cfg)
        produce_events(cfg, bootstrap, n2, seed=2)  # the new topic's events, from offset 0 of each partition
        hs2 = follower.wait_for(hs.version, timeout=120, predicate=lambda h: h.events == n2)
        assert hs2 is not None, f"no hot set of exactly the new topic's {n2} events; log:\n{log.read_text()[-4000:]}"
        assert proc.poll() is None, f"the worker died; log:\n{log.read_text()[-3000:]}"
        text = log.read_text()
        warned = [ln for ln in text.splitlines() if "kafka.on_offsets_lost=earliest" in ln]
        assert len(warned) == 1, text[-4000:]
        assert "WARNING" in warned[0] and f"id {old} is now {new}" in warned[0]
        assert f"{cfg.kafka.events_topic}[0]" in warned[0] and f"{cfg.kafka.events_topic}[1]" in warned[0]
        assert _scrape(cfg.sketch.metrics_port, "streamrec_sketch_offsets_reset_total") == cfg.kafka.partitions

        # still counting the new topic: later events add to it, nothing of the old topic comes back
        produce_events(cfg, bootstrap, 300, seed=3)
        hs3 = follower.wait_for(hs2.version, timeout=60, predicate=lambda h: h.events == n2 + 300)
        assert hs3 is not None, log.read_text()[-3000:]
    finally:
        follower.close()
        assert stop_worker(proc), "the worker needed SIGKILL"
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]


@pytest.mark.timeout(300)
def test_with_fail_a_recreated_topic_stops_the_worker_with_one_line(topics, bootstrap, tmp_path):
    cfg = _cfg(topics, "fail")
    n1 = 2000
    produce_events(cfg, bootstrap, n1, seed=1)
    log = tmp_path / "worker.log"
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(write_config(cfg, tmp_path / "sketch.toml"), bootstrap, log)
    try:
        hs = follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n1)
        assert hs is not None, f"no hot set of the first {n1} events; log:\n{log.read_text()[-3000:]}"
        old, new = _recreate(bootstrap, cfg)
        produce_events(cfg, bootstrap, 500, seed=2)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert proc.poll() == 1, f"the worker did not stop with exit code 1; log:\n{log.read_text()[-4000:]}"
    finally:
        follower.close()
        stop_worker(proc)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    lines = [ln for ln in text.splitlines() if "deleted and recreated" in ln]
    assert len(lines) == 1, text[-4000:]
    line = lines[0]
    assert "streamrec sketch: OffsetsLostError: " in line, line  # (after faust's cursor escapes on stdout)
    assert f"id {old} is now {new}" in line and "expected to resume at offset" in line
    assert "kafka.on_offsets_lost=earliest" in line  # how to go on
    assert text.strip().splitlines()[-1] == line  # the last thing the worker says


@pytest.mark.timeout(420)
def test_a_restarted_worker_applies_the_policy_to_snapshots_of_a_deleted_topic(topics, bootstrap, tmp_path):
    """The topic is deleted and recreated while no worker runs: the next start finds snapshots of the old
    topic and applies ``kafka.on_offsets_lost`` to them as the running worker does (fail: one line;
    latest: the new topic's events from its end on)."""
    from tests.helpers.sketch import end_offsets, snapshot_offsets

    from streamrec.sketch.app import changelog_topic

    cfg = _cfg(topics, "fail")
    n1, n2, n3 = 2000, 800, 600
    produce_events(cfg, bootstrap, n1, seed=1)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    try:
        log1 = tmp_path / "run1.log"
        proc = start_worker(write_config(cfg, tmp_path / "fail.toml"), bootstrap, log1)
        try:
            hs = follower.wait_for(1, timeout=120, predicate=lambda h: h.events == n1)
            assert hs is not None, log1.read_text()[-3000:]
            ends = end_offsets(bootstrap, cfg.kafka.events_topic, cfg.kafka.partitions)
            wait_until(lambda: snapshot_offsets(bootstrap, changelog_topic(cfg.kafka.sketch_group)) == ends, 60,
                       "every partition's snapshot at the topic's end", interval=0.5)
        finally:
            assert stop_worker(proc)
        old, new = _recreate(bootstrap, cfg)
        produce_events(cfg, bootstrap, n2, seed=2)

        # fail: the restart stops with one line, before counting anything of the new topic
        log2 = tmp_path / "run2.log"
        proc = start_worker(tmp_path / "fail.toml", bootstrap, log2)
        try:
            deadline = time.monotonic() + 90
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.3)
            assert proc.poll() == 1, log2.read_text()[-4000:]
        finally:
            stop_worker(proc)
        text = log2.read_text()
        assert "Traceback" not in text, text[-4000:]
        lines = [ln for ln in text.splitlines() if "deleted and recreated" in ln]
        assert len(lines) == 1 and "streamrec sketch: OffsetsLostError: " in lines[0], text[-4000:]
        assert f"id {old} is now {new}" in lines[0]

        # latest: the new topic's events before the start are skipped, those after it are counted
        cfg.kafka.on_offsets_lost = "latest"
        log3 = tmp_path / "run3.log"
        proc = start_worker(write_config(cfg, tmp_path / "latest.toml"), bootstrap, log3)
        try:
            wait_until(lambda: "kafka.on_offsets_lost=latest" in log3.read_text(), 90,
                       "the worker's warning about the recreated topic", interval=0.3)
            produce_events(cfg, bootstrap, n3, seed=3)
            hs3 = follower.wait_for(1, timeout=90, predicate=lambda h: h.events == n3)
            assert hs3 is not None, log3.read_text()[-4000:]
            assert proc.poll() is None
        finally:
            assert stop_worker(proc)
        text = log3.read_text()
        assert "Traceback" not in text, text[-4000:]
        warned = [ln for ln in text.splitlines() if "kafka.on_offsets_lost=latest" in ln]
        assert len(warned) == 1 and "WARNING" in warned[0] and f"id {old} is now {new}" in warned[0], text[-4000:]
    finally:
        follower.close()
