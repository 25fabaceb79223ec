"""Admission by frequency and the row cap, on a real RocksDB store: what is stored, what is read, what a
checkpoint and a restore keep, and which rows a sweep removes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.embedding_store.admission import AdmissionCounter
from streamrec.embedding_store.store_types import UNADMITTED_ID

DIM = 4


def _store(path, **kw) -> EmbeddingStore:
    kw.setdefault("host_cache_rows", 64)
    return EmbeddingStore(StoreSpec(str(path), {"u": DIM}, shards=2, **kw))


def _step(s: EmbeddingStore, ids, g: float = 1.0) -> torch.Tensor:
    ids = np.asarray(sorted(ids), dtype=np.int64)
    rows = s.lookup("u", ids)
    s.apply_gradients("u", ids, torch.full((len(ids), DIM), g))
    return rows


def _stored(s: EmbeddingStore) -> set[int]:
    return {int(i) for name, ids, _ in _all(s) for i in ids}


def _all(s: EmbeddingStore):
    s.flush()
    return [(n, ids, r) for n, ids, r in s.export_records()]


@pytest.mark.parametrize("mode", ["shared", "zero"])
def test_ids_under_the_threshold_never_get_a_row_and_read_the_unadmitted_value(tmp_path, mode):
    s = _store(tmp_path / "s", admit_min_count=3, unadmitted=mode)
    first = _step(s, [1, 2, 10])
    if mode == "zero":
        assert torch.equal(first, torch.zeros(3, DIM))
    else:  # every unadmitted id reads the same (shared) row
        assert torch.equal(first[0], first[1]) and torch.equal(first[1], first[2])
    _step(s, [1, 2, 11])
    assert _stored(s) == ({UNADMITTED_ID} if mode == "shared" else set())
    third = _step(s, [1, 2, 12])  # the third step of 1 and 2: their own rows, at their init
    assert torch.equal(third[:2], torch.from_numpy(s.init_rows("u", np.array([1, 2]))))
    assert _stored(s) == ({1, 2, UNADMITTED_ID} if mode == "shared" else {1, 2})
    before = s.peek("u", np.array([1]))
    _step(s, [1])  # an admitted row then trains normally
    assert not torch.equal(s.peek("u", np.array([1])), before)
    st = s.stats()
    assert st["admission_admitted"] == 2 and st["admission_refused"] == 3 + 3 + 1
    assert st["tables"]["u"]["admission_refused"] == 7
    s.close()


def test_the_shared_row_takes_the_sum_of_the_unadmitted_gradients(tmp_path):
    s = _store(tmp_path / "a", admit_min_count=5)
    ref = _store(tmp_path / "b")
    _step(s, [3, 4, 5], g=0.5)
    _step(ref, [UNADMITTED_ID], g=1.5)  # the same update, applied to the shared row directly
    assert torch.equal(s.peek("u", np.array([UNADMITTED_ID])), ref.peek("u", np.array([UNADMITTED_ID])))
    s.close()
    ref.close()


def test_decisions_survive_a_checkpoint_and_a_clean_reopen(tmp_path):
    s = _store(tmp_path / "s", admit_min_count=2)
    _step(s, [1, 2])
    s.checkpoint(str(tmp_path / "cp"))
    _step(s, [3])
    s.close()
    r = EmbeddingStore.restore(str(tmp_path / "cp"), path=str(tmp_path / "r"), host_cache_rows=64, admit_min_count=2)
    _step(r, [1, 3])  # 1: second step (own row); 3: its first step since the checkpoint (refused)
    assert _stored(r) == {1, UNADMITTED_ID}
    r.close()
    again = _store(tmp_path / "s", admit_min_count=2)  # the live directory: counters saved at close
    _step(again, [3])
    assert 3 in _stored(again)
    again.close()


def test_rows_made_outside_training_count_as_admitted(tmp_path):
    s = _store(tmp_path / "s", admit_min_count=3, hot_capacity_rows=4)
    s.upsert_rows("u", np.array([7]), np.ones((1, DIM), np.float32))
    s.set_hot({"u": np.array([8])})
    s.set_hot({})  # 8 leaves the hot tier with a row stored: it must still read as its own row
    rows = _step(s, [7, 8])
    assert torch.equal(rows[0], torch.ones(DIM))
    assert _stored(s) == {7, 8}
    s.close()


def test_an_id_seen_often_in_one_step_is_admitted_in_that_step(tmp_path):
    """Occurrences count, not steps: a burst of one id in its first step gives it its row at once."""
    from streamrec.embedding_store import note_occurrences

    s = _store(tmp_path / "s", admit_min_count=3)
    ids = np.array([1, 2], dtype=np.int64)
    note_occurrences(s, "u", ids, np.array([5, 1]))  # id 1 five times in the step, id 2 once
    rows = s.lookup("u", ids)
    s.apply_gradients("u", ids, torch.ones(2, DIM))
    assert torch.equal(rows[0], torch.from_numpy(s.init_rows("u", ids[:1]))[0])  # its own row, at its init
    assert _stored(s) == {1, UNADMITTED_ID}
    assert s.tables["u"].admission.estimate(ids).tolist() == [5, 1]
    s.close()


def test_the_counter_errs_only_upwards_and_saturates():
    c = AdmissionCounter(3, 0.01, shared=True)
    ids = np.arange(5000, dtype=np.int64)
    for _ in range(2):
        c.add(ids)
    est = c.estimate(ids)
    assert (est >= 2).all()
    for _ in range(300):
        c.add(ids[:1])
    assert c.estimate(ids[:1])[0] == 255


def test_a_sweep_cuts_each_table_back_to_its_cap(tmp_path):
    s = EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"u": DIM, "v": DIM}, shards=2, host_cache_rows=32, max_rows=100,
                                 eviction="lru", evict_slack=0.1))
    for lo in range(0, 1000, 50):  # 10x more ids than the cap
        ids = np.arange(lo, lo + 50, dtype=np.int64)
        for t in ("u", "v"):
            s.lookup(t, ids)
            s.apply_gradients(t, ids, torch.ones(50, DIM))
        gone = s.evict()
        for t in ("u", "v"):
            n = sum(len(ids) for name, ids, _ in _all(s) if name == t)
            assert n <= 110  # never past the slack
            if t in gone:
                assert n == 100
    assert s.stats()["evicted"] > 1500
    kept = {int(i) for name, ids, _ in _all(s) if name == "u" for i in ids}
    assert max(kept) == 999 and min(kept) >= 850  # lru: the most recently written rows stay
    s.close()


def test_lfu_keeps_the_rows_trained_most_often(tmp_path):
    now = [1000.0]
    s = _store(tmp_path / "s", max_rows=10, eviction="lfu", evict_slack=0.0)
    for _ in range(5):
        _step(s, range(5))  # five popular ids
    for lo in range(100, 200, 10):
        _step(s, range(lo, lo + 10))
    gone = s.evict(clock=lambda: now[0])
    kept = {int(i) for _, ids, _ in _all(s) for i in ids}
    assert set(range(5)) <= kept and len(kept) == 10
    assert len(gone["u"]) == 5 + 100 - 10
    s.close()


def test_hot_rows_and_the_shared_row_are_never_evicted(tmp_path):
    s = _store(tmp_path / "s", max_rows=5, eviction="lru", evict_slack=0.0, admit_min_count=2,
               hot_capacity_rows=3)
    s.set_hot({"u": np.array([900, 901, 902])})
    for _ in range(2):
        _step(s, range(20))
    s.evict()
    cold = {int(i) for _, ids, _ in _all(s) for i in ids}
    assert UNADMITTED_ID in cold and len(cold) == 2  # + the 3 hot rows (their cold copy is written at demotion)
    assert s.hot_mask("u", np.array([900, 901, 902])).all()
    s.close()


def test_a_deleted_row_reads_as_its_init_and_is_not_held(tmp_path):
    s = _store(tmp_path / "s", host_cache_rows=0)
    _step(s, [1, 2])
    assert s.delete_rows("u", np.array([1, 5])) == 1
    rows, held = s.peek_held("u", np.array([1, 2]))
    assert held.tolist() == [False, True]
    assert torch.equal(rows[0], torch.from_numpy(s.init_rows("u", np.array([1])))[0])
    s.close()


def test_streamrec_tables_reports_rows_and_disk_bytes_per_table(tmp_path, capsys):
    import json

    from streamrec.app.cli import main
    from streamrec.embedding_store import table_sizes

    s = EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"user": 8, "item": 16}, shards=2, host_cache_rows=64))
    for t, n in (("user", 300), ("item", 100)):
        ids = np.arange(n, dtype=np.int64)
        s.lookup(t, ids)
        s.apply_gradients(t, ids, torch.ones(n, s.tables[t].dim))
    s.checkpoint(str(tmp_path / "cp"))
    sizes = table_sizes(s)
    s.close()
    assert main(["tables", "--store", str(tmp_path / "cp"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {t: v["rows"] for t, v in out["tables"].items()} == {"user": 300, "item": 100}
    assert out["tables"]["user"]["row_bytes"] == sizes["user"]["row_bytes"]
    assert out["tables"]["item"]["disk_bytes"] > 0 and out["tables"]["item"]["dim"] == 16
    assert main(["tables", "--store", str(tmp_path / "nothing")]) != 0  # one line, no traceback
    assert "no store at" in capsys.readouterr().err
