"""Validated events become a columnar EventBatch: one JaggedIds (values + offsets) per field,
whatever the mix of empty, single and multi-id bags."""

from __future__ import annotations

import numpy as np

from streamrec.ingest import EventSchema


def test_batch_from_parsed_total_equals_events_with_empty_bags(cfg):
    """As many ids as events, but not one per event (a bag of two, an empty bag, a bag of one):
    the offsets follow the bags. 'Total ids == events' must not be taken to mean one id each."""
    schema = EventSchema.from_sections(cfg.model, cfg.ingest, require_label=False)
    f = schema.fields[0]
    events = []
    for bag in ([11, 12], [], [13]):  # 3 ids over 3 events, but not one each
        sparse = {name: [] for name in schema.fields}
        sparse[f] = bag
        events.append({"dense": [0.5] * cfg.model.dense_dim, "sparse": sparse})
    batch = schema.batch_from_parsed([schema.validate(e) for e in events])
    j = batch.sparse[f]
    assert j.offsets.tolist() == [0, 2, 2, 3]
    assert j.values.tolist() == [schema.validate(events[0])[3][f][0], schema.validate(events[0])[3][f][1],
                                 schema.validate(events[2])[3][f][0]]
    for other in schema.fields[1:]:
        assert batch.sparse[other].offsets.tolist() == [0, 0, 0, 0]
    assert np.array_equal(batch.dense, np.full((3, cfg.model.dense_dim), 0.5, np.float32))


def test_schema_from_sections_reads_the_model_and_the_ingest_bound(cfg):
    """The schema built from the ``model`` section and any object with ``dense_abs_max`` is the config's."""
    from types import SimpleNamespace

    schema = EventSchema.from_sections(cfg.model, SimpleNamespace(dense_abs_max=cfg.ingest.dense_abs_max))
    assert schema == EventSchema.from_sections(cfg.model, cfg.ingest)
    assert schema.fields == tuple(cfg.model.field_names) and schema.tasks == tuple(cfg.model.task_names)
    assert EventSchema.from_sections(cfg.model, cfg.ingest, require_label=False).require_label is False
