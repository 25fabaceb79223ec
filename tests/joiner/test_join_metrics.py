"""The joiner's Prometheus families: examples by outcome, late and orphan actions, state rows, the label delay
histogram and the watermark lag, as a scrape reads them."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from streamrec.foundation import EventSchema
from streamrec.app.config import load_config
from streamrec.joiner import Action
from streamrec.joiner.records import Joiner
from streamrec.joiner.metrics import JoinMetrics


def test_a_scrape_shows_what_the_join_did():
    cfg = load_config(None, {"join.window_s": 10.0, "join.allowed_lateness_s": 0.0, "join.orphan_wait_s": 5.0},
                      env={})
    metrics = JoinMetrics(0)
    joiner = Joiner(cfg.join, EventSchema.from_sections(cfg.model, cfg.ingest), metrics)
    metrics.joiner = joiner
    m = joiner.add(0, {})
    m.impression("a", 0, {"ts": 0, "request_id": "a"})
    m.impression("b", 0, {"ts": 0, "request_id": "b"})
    m.action(Action("a", 3000, "click"))  # a positive, 3 s after its impression
    m.action(Action("zz", 20_000, "view"))  # closes b's window: a negative
    m.action(Action("b", 5000, "click"))  # late: b's window closed
    m.action(Action("q", 20_000, "click"))  # waits for its impression ...
    m.impression("c", 30_000, {"ts": 30_000, "request_id": "c"})  # ... which never came: an orphan
    metrics.watermark(0, int(time.time() * 1000) - 60_000)
    joiner.drop(0)  # totals survive a rebalance
    joiner.add(1, {})
    text = generate_latest(metrics.endpoint.registry).decode()
    assert 'streamrec_join_examples_total{outcome="positive"} 1.0' in text
    assert 'streamrec_join_examples_total{outcome="negative"} 1.0' in text
    assert "streamrec_join_actions_late_total 1.0" in text
    assert "streamrec_join_actions_orphan_total 1.0" in text
    assert "streamrec_join_state_rows 0.0" in text  # partition 0 went to another worker
    assert 'streamrec_join_label_delay_seconds_bucket{le="5.0"} 1.0' in text
    assert 'streamrec_join_label_delay_seconds_bucket{le="1.0"} 0.0' in text
    lag = [ln for ln in text.splitlines() if ln.startswith('streamrec_join_watermark_lag_seconds{partition="0"}')]
    assert lag and 59 <= float(lag[0].split()[-1]) <= 70
