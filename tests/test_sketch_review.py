"""Review regressions for the sketch worker's state, follower and publishing paths."""

from __future__ import annotations

import json
import time

import numpy as np

from streamrec.sketch import SketchState
from tests.conftest import small_config


def _event(ts: int, user: int) -> bytes:
    return json.dumps({"ts": ts, "label": 1, "dense": [0, 0, 0],
                       "sparse": {"user": user, "item": 1, "tags": [1]}}).encode()


def test_an_event_time_far_off_does_not_poison_the_counts(tmp_path):
    """One event stamped in microseconds (or at int64's minimum) used to wipe every count and weigh
    every later event 0 (or inf) for good -- snapshots carried it across restarts."""
    st = SketchState(small_config(tmp_path))
    now = int(time.time() * 1000)
    off = 0
    for i in range(50):
        st.apply(0, off, _event(now + i, 7))
        off += 1
    for bad_ts, uid in ((now * 1000, 99), (-2**63, 98), (2**63 - 1, 97)):
        st.apply(0, off, _event(bad_ts, uid))
        off += 1
    for i in range(200):
        st.apply(0, off, _event(now + 1000 + i, 8))
        off += 1
    est = st.merged().estimate("user", np.array([7, 8, 97, 98, 99]))
    assert np.isfinite(est).all(), est
    assert est[0] > 40 and est[1] > 190, est
    assert est[2:].max() < 5, est  # the bad events are not counted
    assert {7, 8} <= set(st.choose(1).tables["user"].tolist())
    assert st.stats.events == 250 and st.stats.bad_records == 3


def test_an_arrow_record_keeps_its_good_events_when_one_time_is_off(tmp_path):
    from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow

    cfg = small_config(tmp_path)
    st = SketchState(cfg)
    batch = next(SyntheticStream(cfg).batches(100))
    batch.ts[3] = int(time.time() * 1000) * 1000  # microseconds
    assert st.apply(0, 0, encode_arrow(batch, EventSchema.from_config(cfg))) is True
    assert st.stats.events == 99 and st.stats.bad_times == 1 and st.stats.bad_records == 0
    assert st.merged().events == 99 and st.merged().now_ms == int(np.delete(batch.ts, 3).max())


def test_a_restarted_worker_publishes_every_partitions_restored_counts(topics, bootstrap, tmp_path):
    """Snapshots were restored only when a partition's next record arrived: after a restart the published
    hot set was chosen from the partitions that had new records only (none at all: nothing published)."""
    import signal

    from streamrec.ingest import encode_json, make_producer
    from streamrec.sketch import HotSetFollower
    from tests.test_sketch_e2e import produce, start_worker, stop, write_config

    cfg = topics
    cfg.sketch.publish_interval_s = 1.0
    cfg.sketch.checkpoint_interval_s = 0.5
    cfg.sketch.half_life_s = 1e7
    cfg.generator.events_per_s = 100_000.0
    config = write_config(cfg, tmp_path / "sketch.toml")
    log = tmp_path / "worker.log"
    n1 = 8_000
    produce(cfg, bootstrap, 0, n1)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic)
    proc = start_worker(config, bootstrap, log)
    try:
        hs1 = follower.wait_for(1, timeout=60, predicate=lambda h: h.events == n1)
        assert hs1 is not None, f"no hot set covering {n1} events; worker log:\n{log.read_text()[-3000:]}"
        time.sleep(6 * cfg.sketch.checkpoint_interval_s)  # every partition's snapshot is in the table
        proc.kill()
        proc.wait(10)
        time.sleep(1.0)
        before = follower.latest().version  # the last set the killed worker published
        # after the restart only partition 0 gets new records
        p = make_producer(bootstrap)
        for i in range(5):
            p.send(cfg.kafka.events_topic, encode_json({"ts": 1_700_000_000_000 + i, "label": 1, "dense": [0, 0, 0],
                                                        "sparse": {"user": 1, "item": 1, "tags": [1]}}), partition=0)
        p.flush()
        p.close()
        proc = start_worker(config, bootstrap, log)
        hs2 = follower.wait_for(before + 1, timeout=60)
        assert hs2 is not None, f"no hot set after the restart; worker log:\n{log.read_text()[-3000:]}"
        assert hs2.events >= n1, f"hot set v{hs2.version} after the restart counts {hs2.events} events, not {n1}+"
        hs3 = follower.wait_for(1, timeout=30, predicate=lambda h: h.events == n1 + 5)
        assert hs3 is not None, f"latest {follower.latest().events} events; log:\n{log.read_text()[-3000:]}"
        assert log.read_text().count("resumed") == cfg.kafka.partitions
    finally:
        exited = stop(proc, signal.SIGTERM)
        follower.close()
    assert exited, "worker ignored SIGTERM"


def test_follower_survives_a_hot_set_record_with_an_out_of_range_number(topics, bootstrap):
    """HotSet.from_bytes let OverflowError out (JSON 1e999 is inf, int(inf) overflows): the follower's thread
    died on such a record (the trainer kept its hot set for good) and latest_hotset raised."""
    import struct

    from streamrec.ingest import make_producer
    from streamrec.sketch import HotSet, HotSetFollower, latest_hotset

    topic = topics.kafka.hotset_topic
    head = b'{"version": 1e999, "coverage": 0, "hit_rate": 0, "window_start_ms": 0, "window_end_ms": 0, ' \
           b'"created_ms": 0, "tables": []}'
    bad = b"SRHS1" + struct.pack("<I", len(head)) + head
    good = HotSet(version=1, tables={"user": np.array([5])}, coverage=0.5, hit_rate=0.5).to_bytes()
    p = make_producer(bootstrap)
    p.send(topic, bad, key=b"hot-set")
    p.flush()
    assert latest_hotset(bootstrap, topic, timeout=5) is None
    with HotSetFollower(bootstrap, topic) as f:
        p.send(topic, good, key=b"hot-set")
        p.flush()
        hs = f.wait_for(1, timeout=15)
        assert hs is not None and hs.tables["user"].tolist() == [5]
        assert f.bad_records == 1
    p.close()
