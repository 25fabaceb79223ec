"""The join state's heaps read ahead from the kept local RocksDB databases (while a restarted worker joins
its group) are used only for a database that still holds exactly what was read: they equal a restore's own
heaps, a batch persisted after the read (or faust's recovery moving the changelog offset) makes the restore
read the rows itself, a stopped or failed read hands out nothing, and every handle is closed by
``finish``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner.state_prescan import StatePrescan
from streamrec.joiner.tx_row import BatchTx
from streamrec.joiner.txstore import OFFSET_KEY, TxStore

RULES = JoinRules("fake_negative", window_ms=100, lateness_ms=10, orphan_ms=50, tasks=(("click", "click"),))


def _db(root: Path, p: int):
    import rocksdict

    return rocksdict.Rdict(str(root / f"join-state-{p}.db"), rocksdict.Options(raw_mode=True))


def _table(db):
    return SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _p: db))


def _batch(js: JoinState, store: TxStore, seq: int, start: int, n: int) -> None:
    """Join ``n`` impressions (every third clicked, one action waiting) and persist the batch as the worker
    does, with a changelog offset."""
    for i in range(start, start + n):
        js.impression(f"r{i}", 10 * i, {"request_id": f"r{i}", "ts": 10 * i})
        if i % 3 == 0:
            js.action(Action(f"r{i}", 10 * i + 5, "click"))
    js.action(Action(f"never{seq}", 10 * (start + n), "click"))
    store.commit(BatchTx(seq=seq, off={}, ends={}))
    store.persist(store.take_outbox(), "changelog", 10 * seq, 10 * seq + 9)


def _heaps(js: JoinState):
    return sorted(js._closing), sorted(js._purge), sorted(js._orphans), js.stats.rows


def _two_partitions(tmp_path):
    paths = {}
    for p in (0, 1):
        db = _db(tmp_path, p)
        store = TxStore(_table(db), p, "imp")
        js = JoinState(RULES, store)
        _batch(js, store, 1, 0, 300)
        _batch(js, store, 2, 300, 200 + 50 * p)
        db.close()
        paths[p] = tmp_path / f"join-state-{p}.db"
    return paths


def _read_ahead(tmp_path) -> tuple[dict, StatePrescan]:
    """Two partitions' databases and a prescan that read them to the end."""
    paths = _two_partitions(tmp_path)
    prescan = StatePrescan(paths, RULES).start()
    prescan.wait()
    return paths, prescan


def _fingerprint(tmp_path, p: int):
    """Partition ``p``'s database fingerprint, through the worker's own read-write open."""
    db = _db(tmp_path, p)
    try:
        return TxStore(_table(db), p, "imp").fingerprint()
    finally:
        db.close()


def test_heaps_read_ahead_equal_a_restores_own_and_are_handed_out_once(tmp_path):
    paths, prescan = _read_ahead(tmp_path)
    prescan.finish()
    for p in paths:
        db = _db(tmp_path, p)  # the worker's own read-write open, after the read ahead closed its handles
        try:
            store = TxStore(_table(db), p, "imp")
            ahead = prescan.take(p, store.fingerprint())
            assert ahead is not None
            used, own = JoinState(RULES, store, heaps=ahead), JoinState(RULES, store)
            assert _heaps(used) == _heaps(own) and used.stats.rows > 0 and used._closing and used._orphans
            assert (used.wi, used.wa) == (own.wi, own.wa) and used.wi is not None
            assert prescan.take(p, store.fingerprint()) is None  # handed out once
        finally:
            db.close()


def test_a_database_written_after_the_read_is_restored_from_its_rows(tmp_path):
    _, prescan = _read_ahead(tmp_path)
    prescan.finish()
    db = _db(tmp_path, 0)
    try:
        store = TxStore(_table(db), 0, "imp")
        js = JoinState(RULES, store)
        _batch(js, store, 3, 600, 40)  # a batch the read ahead did not see
        assert prescan.take(0, store.fingerprint()) is None
    finally:
        db.close()
    db = _db(tmp_path, 1)
    try:
        db[OFFSET_KEY] = b"999"  # faust's changelog recovery moved this copy on
        assert prescan.take(1, TxStore(_table(db), 1, "imp").fingerprint()) is None
    finally:
        db.close()


def test_a_stopped_or_failed_read_hands_out_nothing(tmp_path):
    paths = _two_partitions(tmp_path)
    stopped = StatePrescan(paths, RULES)
    stopped.finish()  # stopped before it started: reads nothing
    stopped.start()
    stopped.finish()
    broken = tmp_path / "join-state-7.db"
    broken.mkdir()
    (broken / "CURRENT").write_text("not a manifest\n")
    failed = StatePrescan({7: broken}, RULES).start()
    failed.wait()
    for p in paths:
        assert stopped.take(p, _fingerprint(tmp_path, p)) is None
    assert failed.take(7, (None, None)) is None
    assert StatePrescan({}, RULES).start().take(0, (None, None)) is None  # nothing kept: nothing to read


def test_heaps_not_taken_by_the_first_restore_are_dropped(tmp_path):
    _, prescan = _read_ahead(tmp_path)
    prescan.discard()
    assert prescan.take(1, _fingerprint(tmp_path, 1)) is None
