"""A joiner's local RocksDB copy is used after a restart only when it is this changelog's state up to its
recorded offset: a copy persisted batch by batch after the changelog's acks is kept, also when stale (the
changelog past its offset then completes it to exactly the full rebuild's state); a copy that is missing,
from another run's changelog or another topic, cut off from its checkpoint record, or corrupt is removed,
so faust rebuilds that partition from the changelog."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from streamrec.joiner import local_state
from streamrec.joiner.local_state import check_local_state, partition_dbs
from streamrec.joiner.tx_row import BatchTx
from streamrec.joiner.txstore import OFFSET_KEY, TxStore

TOPIC = "g-join-state-changelog"
TABLE = "join-state"


class Changelog:
    """One changelog partition in memory: what the worker produced, in order, and what a rebuild finds."""

    def __init__(self):
        self.records: list[tuple[bytes, bytes | None]] = []

    def produce(self, records) -> tuple[int, int]:
        first = len(self.records)
        self.records += records
        return first, len(self.records) - 1

    def fold(self, upto: int | None = None) -> dict[bytes, bytes]:
        state: dict[bytes, bytes] = {}
        for k, v in self.records[: None if upto is None else upto + 1]:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
        return state


def _db(root: Path, p: int):
    import rocksdict

    path = root / "v1" / "tables" / f"{TABLE}-{p}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))


def _batches(db, log: Changelog, p: int, start: int, n: int) -> None:
    """``n`` batches of partition ``p`` committed as the join task does: staged, produced, then persisted."""
    store = TxStore(SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _: db)), p)
    for i in range(start, start + n):
        store[f"i/r{i}"] = {"ts": i}
        if i > 1:
            del store[f"i/r{i - 2}"]
        store.commit(BatchTx(seq=i + 1, off={"imp": i + 1, "act": None}, ends={0: i}))
        records = store.take_outbox()
        first, last = log.produce(records)
        store.persist(records, TOPIC, first, last)


def _local(db) -> dict[bytes, bytes]:
    return {k: v for k, v in db.items() if k != OFFSET_KEY and not k.endswith(b"/ck")}


@pytest.fixture
def lookup(monkeypatch):
    """The changelogs ``check_local_state`` reads: partition -> Changelog, of topic ``TOPIC``."""
    logs: dict[int, Changelog] = {}

    def records(bootstrap, security, topic, wanted, timeout_s=10.0):
        if topic != TOPIC:
            return {}
        return {p: (o, *logs[p].records[o]) for p, o in wanted.items() if p in logs and o < len(logs[p].records)}

    monkeypatch.setattr(local_state, "changelog_records", records)
    return logs


def test_a_copy_persisted_after_the_acks_is_kept_and_a_stale_one_completes_to_the_full_rebuild(tmp_path, lookup):
    log = lookup[0] = Changelog()
    db = _db(tmp_path, 0)
    _batches(db, log, 0, 0, 5)
    assert _local(db) == log.fold()
    db.close()
    # another worker committed more batches to the same changelog since: this copy is stale, not wrong
    other = _db(tmp_path / "other", 0)
    for k, v in log.records:
        if v is not None:
            other[k] = v
    _batches(other, log, 0, 5, 4)
    other.close()
    assert check_local_state(tmp_path, TABLE, TOPIC, "", {}) == {0: "kept"}
    db = _db(tmp_path, 0)
    offset = int(db[OFFSET_KEY])
    for k, v in log.records[offset + 1:]:  # what faust's recovery reads: only past the recorded offset
        if v is None:
            del db[k]
        else:
            db[k] = v
    assert offset < len(log.records) - 1 and _local(db) == log.fold()
    db.close()


def test_a_missing_copy_is_nothing_to_check(tmp_path, lookup):
    assert check_local_state(tmp_path / "none", TABLE, TOPIC, "", {}) == {}


def _one_batch_copy(tmp_path, lookup, p: int = 0) -> Changelog:
    log = lookup[p] = Changelog()
    db = _db(tmp_path, p)
    _batches(db, log, p, 0, 3)
    db.close()
    return log


def test_a_copy_from_another_run_of_the_changelog_is_removed(tmp_path, lookup):
    _one_batch_copy(tmp_path, lookup)
    rerun = Changelog()  # the topic deleted and recreated, the same batches joined again by another run
    db = _db(tmp_path / "rerun", 0)
    _batches(db, rerun, 0, 0, 3)
    db.close()
    lookup[0] = rerun
    verdict = check_local_state(tmp_path, TABLE, TOPIC, "", {})
    assert "not the batch record it persisted" in verdict[0] and 0 not in partition_dbs(tmp_path, TABLE)


def test_a_copy_of_another_changelog_topic_or_past_the_changelog_end_is_removed(tmp_path, lookup):
    _one_batch_copy(tmp_path, lookup, 0)
    log = _one_batch_copy(tmp_path, lookup, 1)
    del log.records[2:]  # partition 1's changelog truncated before its checkpoint record
    verdict = check_local_state(tmp_path, TABLE, TOPIC, "", {})
    assert verdict[0] == "kept" and "holds no record" in verdict[1]
    assert "not g-other" in check_local_state(tmp_path, TABLE, "g-other", "", {})[0]
    assert partition_dbs(tmp_path, TABLE) == {}


def test_a_corrupt_copy_or_checkpoint_or_one_without_a_checkpoint_is_removed(tmp_path, lookup):
    for p in range(3):
        _one_batch_copy(tmp_path, lookup, p)
    dbs = partition_dbs(tmp_path, TABLE)
    for f in dbs[0].iterdir():  # the database's files overwritten
        if f.is_file():
            f.write_bytes(b"\x00garbage" * 64)
    db = _db(tmp_path, 1)
    db[b"1/ck"] = b"{not json"
    db.close()
    db = _db(tmp_path, 2)
    del db[b"2/ck"]  # written by a streamrec that kept no checkpoint
    db.close()
    verdict = check_local_state(tmp_path, TABLE, TOPIC, "", {})
    assert verdict[0].startswith("unreadable") and verdict[1] == "a corrupt checkpoint"
    assert verdict[2].startswith("no checkpoint") and partition_dbs(tmp_path, TABLE) == {}
