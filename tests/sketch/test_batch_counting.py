"""The worker's batched counting path (no broker): ``SketchState.apply_many`` counts a batch exactly as
``apply`` counts its records one by one (bad records skipped with their reasons, redelivered ones not
counted twice, quarantined ones skipped), and the batch marker's crash-loop rules."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from streamrec.ingest import EventSchema, InflightMarker, InflightRange, SyntheticStream, encode_arrow, encode_json
from tests.helpers.sketch import sketch_state
from streamrec.sketch.counting import COUNT, BatchMarker
from tests.conftest import small_config


def _records(cfg, n: int = 300):
    """n one-event JSON records, a few bad ones and an Arrow record among them."""
    b = next(SyntheticStream(cfg).batches(n))
    values = [encode_json(ev) for ev in b.to_events()]
    values[10] = b"not an event"
    values[20] = b'{"ts": 1, "label": 9, "dense": [0, 0, 0]}'
    values[30] = None
    values[40] = encode_arrow(b.take(np.arange(5)), EventSchema.from_sections(cfg.model, cfg.ingest))
    return values


def test_a_batch_counts_what_its_records_count_one_by_one(tmp_path, caplog):
    cfg = small_config(tmp_path)
    values = _records(cfg)
    one = sketch_state(cfg)
    for off, v in enumerate(values):
        one.apply(0, off, v)
    many = sketch_state(cfg)
    many.restore(0, None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamrec.sketch.state"):
        counted = many.apply_many(0, list(range(len(values))), values)
    assert counted == one.stats.events == many.stats.events == 300 - 4 + 5
    assert many.stats.bad_records == one.stats.bad_records == 3
    assert many.stats.records == one.stats.records
    assert caplog.text.count("skipping malformed record") == 3 and "p0@20" in caplog.text
    assert many.next_offset[0] == len(values)
    a, b = one.merged(), many.merged()
    assert a.events == b.events
    for f in cfg.model.field_names:
        ids = np.unique(np.concatenate([a.candidates()[1], b.candidates()[1]]))
        assert np.allclose(a.estimate(f, ids), b.estimate(f, ids))
    assert one.choose(1).tables.keys() == many.choose(1).tables.keys()


def test_redelivered_quarantined_and_revoked_records_are_not_counted(tmp_path):
    cfg = small_config(tmp_path)
    values = [encode_json({"ts": 1_700_000_000_000 + i, "label": 1, "dense": [0, 0, 0],
                           "sparse": {"user": i, "item": 1, "tags": [1]}}) for i in range(100)]
    st = sketch_state(cfg)
    st.restore(0, None)
    assert st.apply_many(0, list(range(60)), values[:60]) == 60
    blob = st.snapshot(0)
    again = sketch_state(cfg)
    again.restore(0, blob)
    again.quarantine.add((0, 70))
    # Kafka redelivers from an older position: 40..59 were counted already, 70 killed a worker
    assert again.apply_many(0, list(range(40, 100)), values[40:]) == 39
    assert again.stats.skipped == 20 and again.stats.quarantined == 1
    assert again.merged().events == 99
    assert again.apply_many(1, [0], values[:1]) == 0  # a partition not held (revoked): left alone
    assert not again.has(1)


@pytest.mark.subprocess  # the suspect batch is probed in a child process
def test_the_marker_of_a_dead_worker_gets_its_batch_probed_then_skipped(tmp_path):
    cfg = small_config(tmp_path)
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    path = tmp_path / "inflight.json"
    values = [json.dumps({"ts": i, "label": 1, "dense": [0, 0, 0]}).encode() for i in range(5)]
    # a worker died counting p2@100-104 for the first time: the records are probed (none kills the probe)
    InflightMarker(path).mark(COUNT, [InflightRange("events", 2, 100, 104)], 0)
    m = BatchMarker(path, "events", schema)
    assert m.begin(2, list(range(100, 105)), values) == set()
    assert InflightMarker(path).found == (COUNT, [InflightRange("events", 2, 100, 104)], 1)
    m.clear()
    assert InflightMarker(path).found is None
    # ... and died again with them in flight: the probe could not reproduce it, so the range is skipped
    InflightMarker(path).mark(COUNT, [InflightRange("events", 2, 100, 104)], 1)
    m = BatchMarker(path, "events", schema)
    assert m.begin(2, [98, 99, 100, 101, 102], values) == {100, 101, 102}
    assert m.begin(2, [103, 104, 105], values[:3]) == {103, 104}
    assert m.begin(2, [106], values[:1]) == set()  # past the range: back to normal
    # a batch of another partition is not a suspect
    InflightMarker(path).mark(COUNT, [InflightRange("events", 2, 100, 104)], 1)
    assert BatchMarker(path, "events", schema).begin(3, [100, 101], values[:2]) == set()
