"""HotSetFollower and latest_hotset read the compacted hot-set topic and survive bad records on it."""

from __future__ import annotations

import numpy as np


def test_follower_survives_a_hot_set_record_with_an_out_of_range_number(topics, bootstrap):
    """A hot-set record with an out-of-range number (JSON 1e999 is inf, int(inf) overflows) is a bad record:
    latest_hotset skips it and the follower's thread counts it and goes on to the next good set (a dead
    follower would leave the trainer on its old hot set for good)."""
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
