"""A sketch worker whose saved state no longer describes the stream starts over instead
of skipping events or refusing to start: a snapshot from a deleted-and-recreated events
topic, and a changelog topic with another partition count than the events topic."""

from __future__ import annotations

import time

from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow, ensure_topics
from streamrec.ingest.broker import TopicSpec
from tests.helpers.sketch import sketch_cluster, sketch_state
from streamrec.sketch.app import changelog_topic, check_state
from tests.conftest import small_config


def _records(cfg, n=512):
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    out = []
    for b in SyntheticStream(cfg).batches(n):
        b.ts[:] = int(time.time() * 1000)
        out.append(encode_arrow(b, schema))
    return out


def test_a_snapshot_of_a_recreated_topic_is_not_resumed(tmp_path):
    cfg = small_config(tmp_path)
    old = sketch_state(cfg, topic_id="11111111-aaaa")
    recs = _records(cfg)
    for i, r in enumerate(recs):
        assert old.apply(0, i, r)
    blob = old.snapshot(0)

    same = sketch_state(cfg, topic_id="11111111-aaaa")
    same.restore(0, blob)
    assert same.next_offset[0] == len(recs) and same.sketches[0].events == old.sketches[0].events

    new = sketch_state(cfg, topic_id="22222222-bbbb")  # the topic was deleted and recreated
    new.restore(0, blob)
    assert new.next_offset[0] == 0 and new.sketches[0].events == 0
    assert new.apply(0, 0, recs[0])  # offset 0 of the new topic is counted, not skipped as "already seen"


def test_a_changelog_with_another_partition_count_is_dropped_with_the_local_state(tmp_path, bootstrap, topics):
    cfg = topics
    cfg.kafka.sketch_group = f"sketch-{cfg.kafka.events_topic}"
    ensure_topics(bootstrap, [TopicSpec(changelog_topic(cfg.kafka.sketch_group), cfg.kafka.partitions + 3)])
    state_dir = tmp_path / "sketch-state"
    (state_dir / "tables").mkdir(parents=True)
    cfg.sketch.state_dir = str(state_dir)
    partitions, topic_id = check_state(cfg.kafka, cfg.sketch.state_dir, sketch_cluster(cfg, bootstrap))
    assert partitions == cfg.kafka.partitions and topic_id
    assert not state_dir.exists()  # the local table went with the changelog it mirrored
    from kafka import KafkaConsumer

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        try:
            gone = changelog_topic(cfg.kafka.sketch_group) not in c.topics()
        finally:
            c.close()
        if gone:
            break
        time.sleep(0.5)
    assert gone
    again = check_state(cfg.kafka, cfg.sketch.state_dir, sketch_cluster(cfg, bootstrap))
    assert again[0] == cfg.kafka.partitions  # and a second start is a no-op
