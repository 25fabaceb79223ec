"""How a serving group answers a push from its siblings' answers (``siblings.Siblings.verdict``), and its
``group.json``: plain values, no processes (the processes themselves: test_serving_group.py)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from streamrec.serving.siblings import Forwarded, Siblings, read_group_file, write_group_file
from streamrec.snapshot import SnapshotError


def _done(*answers: Forwarded) -> list[Future]:
    out = []
    for a in answers:
        f = Future()
        f.set_result(a)
        out.append(f)
    return out


def test_unreachable_siblings_do_not_refuse_a_push_but_a_behind_one_asks_for_a_full_snapshot(tmp_path):
    s = Siblings(tmp_path, 0, "k")
    try:
        assert [a.index for a in s.verdict(_done(Forwarded(1, True), Forwarded(2, False, "UNAVAILABLE", "down")), 7)] == [1, 2]
        assert s.unreachable == 1
        with pytest.raises(SnapshotError) as e:
            s.verdict(_done(Forwarded(1, False, "INVALID_ARGUMENT", "odd"),
                            Forwarded(2, False, "FAILED_PRECONDITION", "delta 7 needs parent 6, serving 5")), 7)
        # the refusal a full snapshot mends wins: the trainer's next snapshot is full
        assert e.value.code == "FAILED_PRECONDITION"
        assert "serving process 2" in str(e.value) and "send a full snapshot" in str(e.value)
        with pytest.raises(SnapshotError) as e:
            s.verdict(_done(Forwarded(3, False, "INVALID_ARGUMENT", "odd")), 7)
        assert e.value.code == "INVALID_ARGUMENT" and "serving process 3" in str(e.value)
    finally:
        s.close()


def test_group_file_round_trip_and_a_process_never_forwards_to_itself(tmp_path):
    assert read_group_file(tmp_path) == {}  # none yet
    write_group_file(tmp_path, {0: 5001, 2: 5003, 1: 5002})
    assert read_group_file(tmp_path) == {0: 5001, 1: 5002, 2: 5003}
    s = Siblings(tmp_path, 1, "k")
    assert s.targets() == {0: "127.0.0.1:5001", 2: "127.0.0.1:5003"}
    s.close()
    (tmp_path / "group.json").write_text("{not json")
    assert read_group_file(tmp_path) == {}
