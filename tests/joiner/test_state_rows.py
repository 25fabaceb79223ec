"""A restore rebuilds the join's due-time heaps from the stored rows without decoding the events they hold:
the heaps, the row count and every later example are those of a restore from decoded rows, and a row in
another layout is read by decoding it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamrec.joiner import Action, JoinRules, JoinState
from streamrec.joiner import state_rows
from streamrec.joiner.state_rows import impression_due
from streamrec.joiner.tx_row import BatchTx
from streamrec.joiner.txstore import TxStore, dumps, loads

RULES = JoinRules("window", window_ms=100, lateness_ms=10, orphan_ms=50, tasks=(("click", "click"),))


def _joined(table) -> tuple[JoinState, TxStore]:
    """A partition's state with open, closed, positive and waiting rows, committed to ``table``."""
    store = TxStore(table, 0, "imp")
    js = JoinState(RULES, store)
    for i in range(40):
        ev = {"request_id": f"r{i}", "ts": 10 * i, "sparse": {"open": i}, "dense": [0.5]}
        js.impression(f"r{i}", 10 * i, ev)
        if i % 3 == 0:
            js.action(Action(f"r{i}", 10 * i + 5, "click"))
    js.action(Action("never", 380, "click"))  # waits for an impression that does not come
    store.commit(BatchTx(seq=1, off={}, ends={}))
    store.persist(store.take_outbox())
    return js, store


def _heaps(js: JoinState):
    return sorted(js._closing), sorted(js._purge), sorted(js._orphans), js.stats.rows, js.wi, js.wa


@pytest.mark.parametrize("rocks", [False, True], ids=["mapping", "rocksdb"])
def test_a_restore_from_undecoded_rows_equals_one_from_decoded_rows(tmp_path, monkeypatch, rocks):
    if rocks:
        import rocksdict

        db = rocksdict.Rdict(str(tmp_path / "db"), rocksdict.Options(raw_mode=True))
        table = SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _: db))
        items = db.items
    else:
        table = {}
        items = table.items
    js, _ = _joined(table)
    rows = {k[4:].decode(): loads(v) for k, v in items() if k.startswith(b"0/s/")}
    assert any(v["open"] for k, v in rows.items() if k.startswith("i/"))
    assert any(not v["open"] for k, v in rows.items() if k.startswith("i/"))
    decodes = []
    monkeypatch.setattr(state_rows, "loads", lambda raw: decodes.append(raw) or loads(raw))
    restored = JoinState(RULES, TxStore(table, 0, "imp"))
    assert len(decodes) == 1  # the waiting action's row; no impression row is decoded
    from_rows = JoinState(RULES, dict(rows))
    assert _heaps(restored) == _heaps(from_rows) == _heaps(js)
    tail = [("i", f"n{i}", 400 + 20 * i) for i in range(10)] + [("a", "r39", 395)]
    outs = []
    for m in (restored, from_rows):
        out = []
        for kind, rid, ts in tail:
            exs = m.impression(rid, ts, {"request_id": rid, "ts": ts}) if kind == "i" else m.action(
                Action(rid, ts, "click"))
            out += [(e.request_id, e.kind, e.event.get("label")) for e in exs]
        outs.append(out)
    assert outs[0] == outs[1] and outs[0]


def test_an_impression_row_is_read_from_its_bytes_or_decoded():
    row = {"ts": -7, "wi": 3, "ev": {"sparse": {"open": True}}, "open": False, "pos": ["a\"open\":true"],
           "done": True}
    assert impression_due(dumps(row)) == (-7, False)
    assert impression_due(row) == (-7, False)
    reordered = {"open": True, "ts": 12, "wi": 3, "ev": {}, "pos": ["x]"], "done": False}
    assert impression_due(dumps(reordered)) == (12, True)  # another layout: decoded
    assert impression_due(dumps({**row, "pos": ["x]"], "open": True})) == (-7, True)


def test_a_row_holding_an_integer_beyond_64_bits_restores_as_the_store_wrote_it():
    from streamrec.joiner.state_rows import decoded
    from streamrec.joiner.txstore import dumps

    row = {"ts": 5, "wi": 5, "ev": {"sparse": {"user": 2**70}}, "open": True, "pos": [], "done": False}
    assert impression_due(dumps(row)) == (5, True)
    assert decoded(dumps([[7, "click", 2**70]])) == [[7, "click", 2**70]]


@pytest.mark.parametrize("mode", ["window", "fake_negative"])
def test_a_closed_impression_keeps_no_event_and_still_dedupes(mode):
    """An open row holds its event (a positive or a window negative is written from it); a closed row drops it,
    and a duplicate of a closed impression is still refused."""
    rules = JoinRules(mode, window_ms=100, lateness_ms=10, orphan_ms=50, tasks=(("click", "click"),))
    store: dict = {}
    js = JoinState(rules, store)
    ev = {"request_id": "r", "ts": 0, "sparse": {"item": 1}, "dense": [0.5]}
    js.impression("r", 0, ev)
    assert store["i/r"]["ev"] == ev and store["i/r"]["open"]
    closed = js.action(Action("other", 200, "click"))  # moves the action watermark past r's window
    assert not store["i/r"]["open"] and "ev" not in store["i/r"]
    if mode == "window":  # its negative was written from the event before the row dropped it
        assert [(x.kind, x.event["sparse"]) for x in closed] == [("negative", {"item": 1})]
    assert dumps(store["i/r"]) == b'{"ts":0,"wi":0,"open":false,"pos":[],"done":' + (
        b"true}" if mode == "window" else b"false}")
    assert impression_due(dumps(store["i/r"])) == (0, False)
    assert js.impression("r", 0, ev) == [] and js.stats.duplicate_impressions == 1
