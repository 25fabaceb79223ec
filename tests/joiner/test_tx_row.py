"""The joiner's batch record: written and read through TxStore as a versioned BatchTx; a row written before
the record carried its version still reads, and a newer version is refused with one line."""

from __future__ import annotations

import pytest

from streamrec.joiner.tx_row import TX_VERSION, BatchTx, TxVersionError
from streamrec.joiner.txstore import TxStore, dumps, loads


def test_a_commit_reads_back_as_the_record_it_wrote_and_its_changes_apply():
    table: dict = {}
    store = TxStore(table, 3, "impressions")
    store["x"] = {"ts": 1}
    tx = BatchTx(seq=2, off={"impressions": 10, "actions": None}, ends={0: 5, 1: 7}, pending=["3|r|example|"])
    store.commit(tx)
    assert not table  # nothing reaches the database before the changelog has it
    store.persist(store.take_outbox())
    row = loads(table[b"3/tx"])
    assert row["v"] == TX_VERSION and row["ends"] == {"0": 5, "1": 7} and row["ch"] == {"x": {"ts": 1}}
    assert TxStore(table, 3).last_tx() == tx
    assert TxStore(table, 3)["x"] == {"ts": 1}


def test_an_unversioned_row_reads_as_version_1_and_recovers():
    table = {b"0/tx": dumps({"seq": 4, "off": {"impressions": 8, "actions": 2}, "ends": {"0": 11},
                             "ch": {"k": [1, "click", 3]}})}
    store = TxStore(table, 0)
    tx = store.recover()
    assert tx == BatchTx(seq=4, off={"impressions": 8, "actions": 2}, ends={0: 11}, pending=[], version=1)
    store.persist(store.take_outbox())
    assert loads(table[b"0/s/k"]) == [1, "click", 3]


def test_a_newer_record_is_refused_before_anything_applies():
    table = {b"0/tx": dumps({"v": TX_VERSION + 1, "seq": 1, "off": {}, "ends": {}, "ch": {"k": 1}})}
    with pytest.raises(TxVersionError, match="batch record of version"):
        TxStore(table, 0).recover()
    assert b"0/s/k" not in table


def test_a_closed_batch_is_read_by_the_next_until_persisted_and_commits_only_its_own_changes():
    table: dict = {}
    store = TxStore(table, 1, "impressions")
    store["x"], store["y"] = {"n": 1}, {"n": 1}
    first = store.stage()  # its examples still in flight: the next batch joins on top of it
    assert store["x"] == {"n": 1} and "y" in store and not table
    store["x"] = {"n": 2}
    del store["y"]
    second = store.stage()
    assert store["x"] == {"n": 2} and "y" not in store and store.get("y") is None
    store.commit(BatchTx(seq=1, off={"impressions": 3}, ends={0: 1}), first)
    store.persist(store.take_outbox())
    assert loads(table[b"1/tx"])["ch"] == {"x": {"n": 1}, "y": {"n": 1}}  # the first batch's, not the second's
    assert store["x"] == {"n": 2} and "y" not in store  # the second batch is still read over the database
    store.commit(BatchTx(seq=2, off={"impressions": 6}, ends={0: 2}), second)
    store.persist(store.take_outbox())
    assert loads(table[b"1/tx"])["ch"] == {"x": {"n": 2}, "y": None} and b"1/s/y" not in table
    assert not store.staged and TxStore(table, 1)["x"] == {"n": 2}


def test_a_persisted_batch_restores_from_its_checkpoint_without_decoding_its_changes(monkeypatch):
    from streamrec.joiner import txstore as txstore_module
    from streamrec.joiner.txstore import Checkpoint

    table: dict = {}
    store = TxStore(table, 2, "impressions")
    for i in range(3):
        store[f"k{i}"] = {"n": i}
    tx = BatchTx(seq=7, off={"impressions": 30, "actions": 4}, ends={0: 9}, pending=["2|r|positive|"])
    store.commit(tx)
    store.persist(store.take_outbox(), "changelog", 40, 43)
    assert Checkpoint.from_bytes(table[b"2/ck"]).tx == tx.to_row() and not store.heads
    decoded = []
    monkeypatch.setattr(txstore_module, "loads", lambda raw: decoded.append(raw) or loads(raw))
    restored = TxStore(table, 2, "impressions")
    assert restored.recover() == tx and not restored.outbox  # nothing to stage again
    assert decoded and table[b"2/tx"] not in decoded  # the checkpoint read, never the row
    table[b"2/tx"] = table[b"2/tx"].replace(b'"n":2', b'"n":5')  # a row the checkpoint does not name
    again = TxStore(table, 2, "impressions")
    assert again.recover() == tx and again.outbox  # decoded and staged again
