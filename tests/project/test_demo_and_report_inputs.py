"""`streamrec demo` refuses a bad --events before starting anything and fails on a trainer that trained nothing,
and `streamrec report` reports what it can read of an odd run. Both run in-process and start nothing (the demo
over real processes is in tests/e2e/)."""

from __future__ import annotations

import pytest

from streamrec.app.cli import main


@pytest.mark.parametrize("events", ["-3", "0"])
def test_demo_refuses_negative_events(tmp_path, capsys, events):
    """A negative --events, or --events 0 without --data, is refused as a bad --events (exit 2) before
    anything starts: not by every child failing on 'trainer.max_events: must be >= 0', a key the user
    never set, nor by silently running the default 300,000 events."""
    code = main(["demo", "--events", events, "--run-dir", str(tmp_path / "run"), "--no-live"])
    assert code == 2
    assert "--events" in capsys.readouterr().err


def test_a_trainer_that_exits_with_no_event_trained_fails_the_demo_naming_the_dead_letters(tmp_path):
    """A file of records that all go to the dead-letter topic leaves the trainer nothing to train: the demo says
    so when the trainer exits, rather than waiting for a snapshot that never comes."""
    from streamrec.app.demo import DemoFailure, View, _watch_training
    from streamrec.app.procs import Supervisor

    class ExitedTrainer:
        def poll(self):
            return 0

    view = View(produced=40)
    with pytest.raises(DemoFailure, match=r"no events trained \(produced 40; .*dead-lettered to 'bad-events'"):
        _watch_training(ExitedTrainer(), Supervisor(tmp_path / "logs"), [], float("inf"), 60.0, view,
                        lambda: None, lambda: None, "bad-events")


def test_report_skips_records_it_cannot_read(tmp_path):
    """`streamrec report` skips a metrics line that is JSON but not an object, a log without 'ts' and a
    view record with "t": null, and reports the rest (none of them is a traceback)."""
    from streamrec.app.report import write_report

    (tmp_path / "metrics.jsonl").write_text('[1, 2]\n{"events": 10, "auc": 0.6}\n')
    (tmp_path / "view.jsonl").write_text('{"t": null, "served_version": 1}\n')
    png, md = write_report(tmp_path)
    assert png.exists() and "| events trained | 10 |" in md.read_text()
