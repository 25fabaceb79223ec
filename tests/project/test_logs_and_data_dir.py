"""Logs and data paths: `--log-format json` gives one JSON object per line with the start-up line's facts;
`--faust-log-level` reaches faust's loggers whatever `--log-level` says; kafka-python's slow-task warning is
kept only for a real stall; `--data-dir` roots every relative data path (and the metrics log the report
reads); the trainer's freshness is measured by the Kafka clock and the event clock."""

from __future__ import annotations

import argparse
import io
import json
import logging
import math

import numpy as np

from streamrec.app.logs import (ClosedTransportFilter, JsonFormatter, SlowTaskFilter, set_library_level, setup_logging,
                                startup_line)
from streamrec.app.preflight import apply_data_dir
from streamrec.app.config import Config


def _capture(fmt: str):
    setup_logging("INFO", fmt)
    buf = io.StringIO()
    logging.getLogger().handlers[0].stream = buf
    return buf


def test_json_log_lines_carry_the_start_up_facts():
    buf = _capture("json")
    try:
        args = argparse.Namespace(config="x.toml", overrides=["a.b=1"], data_dir=None)
        startup_line("train", args, brokers="h:9092", device="cpu", data="/d", ports="")
        rec = json.loads(buf.getvalue().strip())
    finally:
        setup_logging("INFO", "text")
    assert rec["level"] == "info" and rec["logger"] == "streamrec.train" and rec["event"] == "start"
    assert rec["brokers"] == "h:9092" and rec["device"] == "cpu" and rec["data"] == "/d" and "ports" not in rec
    assert rec["config"].startswith("x.toml") and "1 --set" in rec["config"]
    assert "train starting:" in rec["msg"] and rec["ts"].endswith("Z")


def test_json_formatter_keeps_the_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        r = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    rec = json.loads(JsonFormatter().format(r))
    assert rec["msg"] == "failed here" and "ValueError: boom" in rec["exc"]


def test_faust_log_level_is_honoured_under_a_quieter_root():
    setup_logging("WARNING", "text")
    try:
        assert not logging.getLogger("faust").isEnabledFor(logging.INFO)
        set_library_level("info")
        assert logging.getLogger("faust.worker").isEnabledFor(logging.INFO)
        assert logging.getLogger("mode").isEnabledFor(logging.INFO)
        assert not logging.getLogger("streamrec.sketch").isEnabledFor(logging.INFO)  # ours keep --log-level
    finally:
        setup_logging("INFO", "text")
        logging.getLogger("streamrec").setLevel(logging.NOTSET)


def test_slow_task_warning_only_for_a_real_stall():
    f = SlowTaskFilter(keep_above_s=1.0)

    def rec(elapsed):
        return logging.LogRecord("kafka.net.selector", logging.WARNING, __file__, 1,
                                 f"Task <t> ran for {elapsed:.3f}s (>0.100s threshold). It is blocking the event loop "
                                 "-- likely a tight sync loop inside a coroutine.", (), None)

    assert not f.filter(rec(0.132)) and f.filter(rec(2.5))
    other = logging.LogRecord("kafka.net.selector", logging.WARNING, __file__, 1, "something else", (), None)
    assert f.filter(other)


def test_a_transport_closed_under_the_network_thread_is_no_error_line(capsys):
    """The AttributeError kafka-python's network thread logs when it reads a connection closed that instant (its
    socket None) is dropped at the default levels; any other error of the transport still shows."""
    import sys

    def rec(exc):
        try:
            raise exc
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord("kafka.net.transport", logging.ERROR, __file__, 1,
                                 "<KafkaTCPTransport [none] (closed)>: Error receiving network data closing socket",
                                 (), info)

    closed = rec(AttributeError("'NoneType' object has no attribute 'recv'"))
    assert not ClosedTransportFilter().filter(closed) and closed.levelno == logging.DEBUG
    assert ClosedTransportFilter().filter(rec(ConnectionResetError(104, "Connection reset by peer")))
    setup_logging("INFO", "text")
    try:
        log = logging.getLogger("kafka.net.transport")
        log.error("Error receiving network data", exc_info=closed.exc_info)
        log.error("Error receiving network data", exc_info=rec(ConnectionResetError(104, "reset")).exc_info)
        err = capsys.readouterr().err
        assert "ConnectionResetError" in err and "NoneType" not in err
    finally:
        setup_logging("INFO", "text")


def test_data_dir_roots_relative_paths_only(tmp_path):
    cfg = Config()
    cfg.trainer.snapshot_dir = "/abs/snapshots"
    cfg.sketch.state_dir = "custom/sketch"
    cfg = apply_data_dir(cfg, str(tmp_path))
    assert cfg.store.path == str(tmp_path / "store")
    assert cfg.trainer.checkpoint_dir == str(tmp_path / "checkpoints")
    assert cfg.serving.data_dir == str(tmp_path / "serving")
    assert cfg.sketch.state_dir == str(tmp_path / "custom/sketch")
    assert cfg.trainer.snapshot_dir == "/abs/snapshots"
    assert cfg.trainer.log_path == str(tmp_path / "metrics.jsonl")  # what `streamrec report DIR` reads


def test_freshness_by_both_clocks():
    from streamrec.foundation import EventBatch
    from streamrec.trainer.telemetry import Freshness

    f = Freshness()
    assert all(math.isnan(v) for v in f.record(0).values())  # nothing trained yet: unknown, not 0
    b = EventBatch.empty(0, ["a"])
    b.source_newest_ms = 1_000_000
    f.observe(b)
    b.source_newest_ms = 900_000  # an older record later (another partition) never moves it back
    f.observe(b)
    r = f.record(newest_event_ms=400_000, now_ms=1_002_500)
    assert r == {"freshness_event_s": 602.5, "freshness_kafka_s": 2.5}
    merged = EventBatch.concat([b, EventBatch.empty(0, ["a"])], 0, ["a"])
    assert merged.source_newest_ms == 900_000
    assert np.isfinite(f.record(1, now_ms=0.0)["freshness_kafka_s"])  # a clock behind: 0, never negative
