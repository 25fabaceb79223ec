"""Review regressions for the sketch worker's state, follower and publishing paths."""

from __future__ import annotations

import json
import time

import numpy as np

from sketch import SketchState
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
    from ingest import EventSchema, SyntheticStream, encode_arrow

    cfg = small_config(tmp_path)
    st = SketchState(cfg)
    batch = next(SyntheticStream(cfg).batches(100))
    batch.ts[3] = int(time.time() * 1000) * 1000  # microseconds
    assert st.apply(0, 0, encode_arrow(batch, EventSchema.from_config(cfg))) is True
    assert st.stats.events == 99 and st.stats.bad_times == 1 and st.stats.bad_records == 0
    assert st.merged().events == 99 and st.merged().now_ms == int(np.delete(batch.ts, 3).max())
