"""The evidence's recent-id memory survives a restart: it travels in the checkpoint (real files, written and read
as the trainer does), so a restarted trainer's first window reports the stream's share of new ids, and serving's
guard promotes it; a trainer that forgot its memory reports nearly every id as new and the guard holds a good
version as ``field_novel``."""

from __future__ import annotations

import numpy as np

from streamrec.app.config import load_config
from streamrec.foundation import EventBatch, JaggedIds
from streamrec.serving.guard import Guard
from streamrec.trainer.checkpoint import read_checkpoint, write_checkpoint
from streamrec.trainer.evidence import EvidenceCollector

FIELDS = ["user", "item"]


def _batch(rng, n=500):
    """Ids from a fixed catalogue (a steady stream: after a while almost every id has been seen)."""
    offs = np.arange(n + 1, dtype=np.int64)
    return EventBatch(ts=np.zeros(n, np.int64), labels=(rng.random(n) < 0.3).astype(np.float32),
                      dense=rng.normal(size=(n, 1)).astype(np.float32),
                      sparse={f: JaggedIds(rng.integers(0, 3000, n).astype(np.int64), offs) for f in FIELDS})


def _window(c: EvidenceCollector, rng, batches=4):
    for _ in range(batches):
        b = _batch(rng)
        c.observe_inputs(b)
        c.observe_scores(b.labels[:, None], np.full((len(b), 1), 0.3))
    return c.take(0)


def _collector():
    return EvidenceCollector(["click"], FIELDS, 1, recent_events=5000)


def test_the_memory_written_to_a_checkpoint_gives_a_restarted_trainer_the_streams_novel_share(tmp_path):
    rng = np.random.default_rng(0)
    before = _collector()
    history = [_window(before, rng) for _ in range(12)]
    path = write_checkpoint(tmp_path, 1, {"seq": 1}, {"evidence_memory": before.memory_state()}, lambda d: {})
    _, dense = read_checkpoint(path)

    restored, forgotten = _collector(), _collector()
    restored.load_memory_state(dense["evidence_memory"])
    first = _window(restored, np.random.default_rng(99))
    empty = _window(forgotten, np.random.default_rng(99))
    steady = history[-1].input.field_novel_share
    for f in FIELDS:
        assert abs(first.input.field_novel_share[f] - steady[f]) < 0.05, (first.input, steady)
        assert empty.input.field_novel_share[f] > steady[f] + 0.3  # an empty memory counts most ids as new

    g = Guard(load_config(None, {}, env={}).serving.guard)
    for ev in history:
        if g.judge(ev.to_block()).ok:
            g.promoted(ev.to_block())
    assert g.judge(first.to_block()).ok, g.judge(first.to_block()).reason
    assert g.judge(empty.to_block()).reason == "field_novel"


def test_a_memory_of_another_size_or_none_leaves_the_memory_empty():
    c = _collector()
    c.load_memory_state(None)
    c.load_memory_state({"bits": 8, "fields": {}})
    ev = _window(c, np.random.default_rng(1), batches=1)
    assert all(v > 0.9 for v in ev.input.field_novel_share.values())  # nothing was taken back: all new
