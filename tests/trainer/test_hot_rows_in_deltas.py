"""A delta carries the hot rows training changed since the previous snapshot: the fused step updates the device
tier's rows in place (no ``apply_gradients`` call for the journal to note), and the journal notes them at its
cut from their write stamps. Without that, serving kept each hot row as the last full snapshot had it, and a
burst's newest hot rows never reached it once the stream went quiet."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.app.config import load_config
from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.trainer import TrainerCore
from streamrec.trainer.changes import ChangeJournal


def _rows(batches) -> dict[tuple[str, int], np.ndarray]:
    out = {}
    for b in batches:
        d = b.to_pydict()
        for t, i, v in zip(d["table"], d["id"], d["vector"]):
            out[(t, int(i))] = np.asarray(v, np.float32)
    return out


def test_a_delta_carries_every_hot_row_trained_since_the_previous_snapshot(tmp_path):
    cfg = load_config(None, {"trainer.batch_size": 256}, env={})
    store = ChangeJournal(EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu",
                                                       path=str(tmp_path / "store")))
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    fields = cfg.model.field_names
    events = EventBatch.concat(list(SyntheticStream(cfg).batches(6000)), cfg.model.dense_dim, fields)
    first, later = events.take(np.arange(3000)), events.take(np.arange(3000, 6000))
    core.feed(first, flush=True)
    table = core.field_tables[fields[0]]
    ids = np.unique(np.asarray(first.sparse[fields[0]].values))
    hot = ids[: min(len(ids), int(store.hot_capacity_rows) // 2)]
    core.apply_hot_set(1, {table: hot})
    assert store.hot_mask(table, hot).all()

    rows, mark = store.snapshot_rows((True, None, 0))  # a full snapshot: every row as it is now
    full = _rows(rows)
    core.feed(later, flush=True)  # trains the hot rows in place on the device tier
    delta = _rows(store.snapshot_rows((False, 1, mark))[0])

    now = store.peek(table, hot).numpy()
    changed = [k for k, i in enumerate(hot) if not np.array_equal(full[(table, int(i))], now[k])]
    assert len(changed) > 100, "the later events train many of the hot rows"
    for k in changed:  # serving gets each trained hot row's current vector
        assert (table, int(hot[k])) in delta, int(hot[k])
        np.testing.assert_array_equal(delta[(table, int(hot[k]))], now[k])
    # and the next delta, with nothing trained in between, repeats none of them
    _, mark2 = store.snapshot_rows((False, 1, mark))
    assert not _rows(store.snapshot_rows((False, 2, mark2))[0])
