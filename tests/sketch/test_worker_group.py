"""Several sketch workers split the partitions; the publishing worker merges its own partition sketches
with the other workers' snapshots and chooses the hot set one worker reading everything would (no broker:
the snapshot bytes are what the table's changelog carries)."""

from __future__ import annotations

import numpy as np

from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow
from tests.helpers.sketch import sketch_state
from tests.conftest import small_config

PARTITIONS = 4


def _records(cfg, n_events: int, per_message: int = 128):
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    out = []  # (partition, offset, bytes), round-robin like an unkeyed producer
    offsets = [0] * PARTITIONS
    i = 0
    for chunk in SyntheticStream(cfg).batches(n_events):
        for s in range(0, len(chunk), per_message):
            p = i % PARTITIONS
            out.append((p, offsets[p], encode_arrow(chunk.take(np.arange(s, min(len(chunk), s + per_message))),
                                                    schema)))
            offsets[p] += 1
            i += 1
    return out


def _keys(hs) -> set:
    return {(t, int(x)) for t, ids in hs.tables.items() for x in ids}


def test_the_merged_hot_set_of_two_workers_is_the_single_workers(tmp_path):
    cfg = small_config(tmp_path, **{"hot.budget_rows": 500})
    recs = _records(cfg, 40_000)
    single, a, b = sketch_state(cfg), sketch_state(cfg), sketch_state(cfg)
    for p, off, v in recs:
        single.apply(p, off, v)
        (a if p % 2 == 0 else b).apply(p, off, v)  # worker a owns 0 and 2, worker b 1 and 3
    peers = {p: b.snapshot(p) for p in (1, 3)}  # what b wrote to the table's changelog
    want = single.choose(1)
    got = a.choose(1, peers)
    alone = a.choose(1)
    assert got.events == want.events == 40_000 and alone.events < 25_000
    recall = len(_keys(got) & _keys(want)) / len(_keys(want))
    assert recall >= 0.99, recall
    assert len(_keys(alone) & _keys(want)) / len(_keys(want)) < recall  # the peers' partitions matter


def test_unusable_peer_snapshots_are_left_out(tmp_path):
    cfg = small_config(tmp_path)
    recs = _records(cfg, 4_000)
    a, b = sketch_state(cfg, topic_id="new-topic"), sketch_state(cfg, topic_id="old-topic")
    for p, off, v in recs:
        (a if p % 2 == 0 else b).apply(p, off, v)
    peers = {1: b.snapshot(1), 3: b"\x00 not a sketch"}
    got = a.choose(1, peers)  # b's snapshot is of another topic (recreated): not merged; garbage: skipped
    assert got.events == a.choose(1).events
