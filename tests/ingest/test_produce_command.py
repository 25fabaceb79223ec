"""`streamrec produce`: it replays a file into the events topic exactly, and Ctrl-C stops it
cleanly (exit 130) with every event it reports sent in the topic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streamrec.app.cli import main as streamrec_main
from streamrec.ingest import EventSchema, SyntheticStream, read_topic, write_events
from tests.helpers.ingest import consume_all, events_of

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_produce_command_replays_a_file(topics, bootstrap, tmp_path, capsys):
    cfg = topics
    path = tmp_path / "ev.parquet"
    write_events(path, SyntheticStream(cfg).batches(3000), EventSchema.from_sections(cfg.model, cfg.ingest))
    args = ["produce", str(path), "--bootstrap", bootstrap, "--codec", "arrow", "-q", "--limit", "2500",
            "--set", f"kafka.events_topic={cfg.kafka.events_topic}", "--set", f"kafka.dlq_topic={cfg.kafka.dlq_topic}",
            "--set", f"kafka.hotset_topic={cfg.kafka.hotset_topic}",
            "--set", f"model.fields={json.dumps([f.__dict__ for f in cfg.model.fields])}", "--set", "model.dense_dim=3"]
    assert streamrec_main(args) == 0
    assert "produced 2,500 events" in capsys.readouterr().out
    batches, stats = consume_all(bootstrap, cfg, 2500)
    assert sum(len(b) for b in batches) == 2500 and stats.dead_letters == 0
    expected = next(SyntheticStream(cfg).batches(2500))
    assert events_of(batches) == events_of([expected])


def test_produce_ctrl_c_stops_cleanly(topics, bootstrap, tmp_path):
    cfg = topics
    cmd = [sys.executable, "-m", "streamrec", "produce", "--synthetic", "100000", "--rate", "500", "-q",
           "--bootstrap", bootstrap, "--set", f"kafka.events_topic={cfg.kafka.events_topic}",
           "--set", f"kafka.dlq_topic={cfg.kafka.dlq_topic}", "--set", f"kafka.hotset_topic={cfg.kafka.hotset_topic}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        deadline = time.monotonic() + 60  # start-up imports can be slow on a busy machine
        while time.monotonic() < deadline and proc.poll() is None and not read_topic(
                bootstrap, cfg.kafka.events_topic, timeout=0.5):
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert out.startswith("interrupted: produced "), (out, err)
    sent = int(out.split()[2].replace(",", ""))
    assert 0 < sent < 100000
    records = read_topic(bootstrap, cfg.kafka.events_topic, timeout=15)
    full = load_default_cfg()
    from streamrec.ingest import Decoder

    dec = Decoder(EventSchema.from_sections(full.model, full.ingest))
    assert sum(len(dec.decode(r.value)) for r in records) == sent  # everything reported sent is in the topic


def load_default_cfg():
    from streamrec.app.config import load_config

    return load_config(None, {}, env={})
