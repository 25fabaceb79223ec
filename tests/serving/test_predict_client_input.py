"""The predict client's input: events from JSON become gRPC requests or a RequestError that names
the event and the key at fault; `streamrec predict` reads files with a UTF-8 BOM and refuses a
batch size below one. No server is started: nothing here gets as far as a connection."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("columns", [True, False])
def test_predict_request_shape_errors_name_the_event(columns):
    """A bad JSON shape is a RequestError naming the event and key (not a TypeError/ValueError/OverflowError
    traceback from `streamrec predict`), and dense lists of different lengths are refused, never
    concatenated (which would shift values into the next event)."""
    from streamrec.serving import RequestError, events_to_request

    cases = [
        ([{"dense": [1, 2, 3]}, {"dense": [4]}], r"events\[1\]\.dense"),  # 4 values = 2 x dense_dim 2
        ([{"dense": [1]}, {"sparse": [1, 2]}], r"events\[1\]\.sparse"),
        ([{"dense": [1]}, {"dense": [1], "sparse": "user"}], r"events\[1\]\.sparse"),
        ([{"dense": [1]}, {"dense": [10**400]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": [[1]]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": ["x"]}], r"events\[1\]\.dense"),
        ([{"dense": [1]}, {"dense": [1], "ts": "noon"}], r"events\[1\]\.ts"),
    ]
    for events, where in cases[0 if columns else 1:]:  # one message per event has its own dense length
        with pytest.raises(RequestError, match=where):
            events_to_request(events, columns=columns)


def test_predict_reads_input_with_a_utf8_bom(tmp_path):
    """Windows editors and PowerShell write a BOM: `streamrec predict` reads such a file like one without."""
    from streamrec.app.commands.serve import read_events

    events = [{"dense": [1, 2, 3], "user": 1}, {"dense": [0, 0, 0], "item": "x"}]
    arr, lines = tmp_path / "a.json", tmp_path / "l.jsonl"
    arr.write_text(json.dumps(events), encoding="utf-8-sig")
    lines.write_text("\n".join(map(json.dumps, events)) + "\n", encoding="utf-8-sig")
    assert read_events(str(arr)) == events
    assert read_events(str(lines)) == events


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_predict_refuses_a_batch_size_below_one(tmp_path, capsys, batch):
    """--batch 0 would send empty requests and --batch -1 would silently skip events: both are refused
    (exit 2) before any connection."""
    from streamrec.app.cli import main

    path = tmp_path / "ev.jsonl"
    path.write_text('{"dense": [1, 2, 3]}\n{"dense": [1, 2, 3]}\n')
    assert main(["predict", str(path), "--batch", batch, "--target", "127.0.0.1:1", "--timeout", "2"]) == 2
    assert "--batch must be >= 1" in capsys.readouterr().err
