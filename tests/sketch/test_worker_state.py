"""The sketch worker's state (no broker): malformed records and events stamped far off in time never
reach the counts, a record's good events are kept when one of them is bad, and a redelivered record
is not counted twice after a restore."""

from __future__ import annotations

import json
import time

import numpy as np

from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow, encode_json
from tests.helpers.sketch import sketch_state
from tests.conftest import small_config


def _event(ts: int, user: int) -> bytes:
    return json.dumps({"ts": ts, "label": 1, "dense": [0, 0, 0],
                       "sparse": {"user": user, "item": 1, "tags": [1]}}).encode()


def test_malformed_records_never_reach_the_sketch(tmp_path):
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    st = sketch_state(cfg)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    good = next(SyntheticStream(cfg).batches(100))
    bad = [b"", b"garbage", b'{"ts": 1, "label": 7}', b"\xff\xff\xff\xff broken arrow",
           encode_json({"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"nope": 1}}), None]
    for off, v in enumerate(bad):
        assert st.apply(0, off, v) is False
    assert st.stats.bad_records == len(bad) and st.merged() is None and st.choose(1) is None
    assert st.apply(0, len(bad), encode_arrow(good, schema)) is True
    assert st.stats.events == 100 and st.merged().events == 100
    # a redelivered record (offset below the snapshot's) is not counted twice
    blob = st.snapshot(0)
    st2 = sketch_state(cfg)
    st2.restore(0, blob)
    assert st2.apply(0, len(bad), encode_arrow(good, schema)) is False and st2.stats.skipped == 1
    assert st2.merged().events == 100


def test_an_event_time_far_off_does_not_poison_the_counts(tmp_path):
    """An event stamped in microseconds (or at int64's extremes) is refused as a bad record: counted, it
    would wipe every count and weigh every later event 0 (or inf) for good, across restarts too, since
    snapshots carry it."""
    st = sketch_state(small_config(tmp_path))
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
    st = sketch_state(cfg)
    batch = next(SyntheticStream(cfg).batches(100))
    batch.ts[3] = int(time.time() * 1000) * 1000  # microseconds
    assert st.apply(0, 0, encode_arrow(batch, EventSchema.from_sections(cfg.model, cfg.ingest))) is True
    assert st.stats.events == 99 and st.stats.bad_times == 1 and st.stats.bad_records == 0
    assert st.merged().events == 99 and st.merged().now_ms == int(np.delete(batch.ts, 3).max())
