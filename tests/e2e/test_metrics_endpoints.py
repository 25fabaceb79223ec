"""Every process serves Prometheus /metrics: scraped while `streamrec demo` runs the real pipeline (sketch
worker, trainer and serving as separate processes), parsed with prometheus-client's own parser.

The demo run is the one tests/e2e/test_demo.py checks end to end (the ``scraped_demo`` fixture,
tests/helpers/demo.py): one pipeline, scraped twice mid-run, then left to finish."""

from __future__ import annotations

import grpc
import pytest

from tests.conftest import HEAVY_GROUP

from tests.helpers.demo import value

# one xdist worker runs the demo runs and the group kill test one after another (conftest.HEAVY_GROUP)
pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.xdist_group(HEAVY_GROUP)]

EXPECTED = {
    "sketch": {
        "streamrec_sketch_records_consumed": "counter", "streamrec_sketch_events_consumed": "counter",
        "streamrec_sketch_records_skipped": "counter", "streamrec_sketch_hot_sets_published": "counter",
        "streamrec_sketch_partition_lag_records": "gauge", "streamrec_sketch_hot_set_version": "gauge",
        "streamrec_sketch_hot_set_coverage": "gauge",
    },
    "trainer": {
        "streamrec_trainer_events_consumed": "counter", "streamrec_trainer_events_trained": "counter",
        "streamrec_trainer_dead_letters": "counter", "streamrec_trainer_events_skipped": "counter",
        "streamrec_trainer_pushes": "counter", "streamrec_trainer_checkpoints": "counter",
        "streamrec_trainer_partition_lag_records": "gauge", "streamrec_trainer_lag_records": "gauge",
        "streamrec_trainer_hot_set_version": "gauge", "streamrec_trainer_hot_set_coverage": "gauge",
        "streamrec_trainer_freshness_kafka_seconds": "gauge", "streamrec_trainer_train_step_seconds": "histogram",
        "streamrec_trainer_checkpoint_seconds": "histogram", "streamrec_trainer_push_seconds": "histogram",
    },
    "serving": {
        "streamrec_serving_predict_requests": "counter", "streamrec_serving_pushes": "counter",
        "streamrec_serving_swaps": "counter", "streamrec_serving_events_scored": "counter",
        "streamrec_serving_model_version": "gauge", "streamrec_serving_freshness_event_seconds": "gauge",
        "streamrec_serving_up": "gauge", "streamrec_serving_predict_latency_seconds": "histogram",
        "streamrec_serving_push_seconds": "histogram",
    },
}


@pytest.mark.timeout(900)  # above the shared demo's own waits (tests/helpers/demo.py: 240 + 60 + 420 s)
def test_every_process_serves_prometheus_metrics(scraped_demo):
    demo = scraped_demo
    assert demo.scrape_error is None, f"{demo.scrape_error}: {demo.stderr[-4000:]}"
    first, second, ports = demo.first, demo.second, demo.ports
    assert demo.predict_scores == 2
    assert demo.bad_field_code == grpc.StatusCode.INVALID_ARGUMENT  # a field the model does not have

    for proc_name, names in EXPECTED.items():
        for name, kind in names.items():
            assert name in second[proc_name], (proc_name, name, sorted(second[proc_name]))
            assert second[proc_name][name][0] == kind, (proc_name, name, second[proc_name][name][0])
            assert name in first[proc_name]
    # counters (and histogram counts) only grow between two scrapes
    for proc_name in ports:
        for name, (kind, samples) in second[proc_name].items():
            if kind not in ("counter", "histogram"):
                continue
            for key, v in first[proc_name][name][1].items():
                if key[0].endswith(("_total", "_count", "_bucket")):
                    assert samples.get(key, -1) >= v, (proc_name, key, v, samples.get(key))
    # and those the run drives between the two scrapes have grown: the stream is still produced (the sketch and
    # the trainer consume), and two Predict calls (one refused) were made after the first scrape
    def grew(proc_name, name, sample, by=1, **labels):
        before, after = value(first[proc_name], name, sample, **labels), value(second[proc_name], name, sample, **labels)
        assert after >= before + by, (proc_name, sample, labels, before, after)

    grew("sketch", "streamrec_sketch_events_consumed", "streamrec_sketch_events_consumed_total")
    grew("trainer", "streamrec_trainer_events_consumed", "streamrec_trainer_events_consumed_total")
    grew("serving", "streamrec_serving_predict_requests", "streamrec_serving_predict_requests_total", code="OK")
    grew("serving", "streamrec_serving_predict_requests", "streamrec_serving_predict_requests_total",
         code="INVALID_ARGUMENT")
    grew("serving", "streamrec_serving_predict_latency_seconds", "streamrec_serving_predict_latency_seconds_count",
         by=2)
    s = second["serving"]
    assert value(s, "streamrec_serving_predict_requests", "streamrec_serving_predict_requests_total", code="OK") >= 1
    assert value(s, "streamrec_serving_predict_requests", "streamrec_serving_predict_requests_total",
                 code="INVALID_ARGUMENT") >= 1
    assert value(s, "streamrec_serving_predict_latency_seconds", "streamrec_serving_predict_latency_seconds_count") >= 2
    assert value(s, "streamrec_serving_swaps", "streamrec_serving_swaps_total") >= 1
    assert value(s, "streamrec_serving_model_version") >= 1
    t = second["trainer"]
    assert value(t, "streamrec_trainer_pushes", "streamrec_trainer_pushes_total", result="OK") >= 1
    assert value(t, "streamrec_trainer_train_step_seconds", "streamrec_trainer_train_step_seconds_count") > 0
    assert any(k[1] for k in t["streamrec_trainer_partition_lag_records"][1]), "no per-partition lag samples"
    assert value(t, "streamrec_trainer_events_consumed", "streamrec_trainer_events_consumed_total") >= \
        value(t, "streamrec_trainer_events_trained", "streamrec_trainer_events_trained_total") > 0
    sk = second["sketch"]
    assert value(sk, "streamrec_sketch_events_consumed", "streamrec_sketch_events_consumed_total") > 0
    assert any(k[1] for k in sk["streamrec_sketch_partition_lag_records"][1]), "no per-partition lag samples"
