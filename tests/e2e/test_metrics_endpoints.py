"""Every process serves Prometheus /metrics: scraped while `streamrec demo` runs the real pipeline (sketch
worker, trainer and serving as separate processes), parsed with prometheus-client's own parser."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

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


def scrape(port: int) -> dict[str, tuple[str, dict]]:
    """name -> (type, {(sample name, labels): value}) of one /metrics page."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        out[fam.name] = (fam.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples})
    return out


def value(page, name, sample=None, **labels) -> float:
    samples = page[name][1]
    key = (sample or name, tuple(sorted(labels.items())))
    return samples.get(key, 0.0)


def try_scrape(port):
    try:
        return scrape(port)
    except OSError:
        return None


def test_every_process_serves_prometheus_metrics(bootstrap, tmp_path):
    from streamrec.ingest import free_port
    from streamrec.serving import ServingClient

    run_dir = tmp_path / "run"
    ports = {"sketch": free_port(), "trainer": free_port(), "serving": free_port()}
    cmd = [sys.executable, "-m", "streamrec", "demo", "--bootstrap", bootstrap, "--events", "60000", "--rate", "2000",
           "--run-dir", str(run_dir), "--no-live", "--timeout", "300",
           "--set", f"kafka.events_topic=metrics-{run_dir.parent.name}",
           "--set", f"kafka.dlq_topic=metrics-{run_dir.parent.name}.dlq",
           "--set", f"kafka.hotset_topic=metrics-hot-{run_dir.parent.name}",
           "--set", f"kafka.trainer_group=metrics-trainer-{run_dir.parent.name}",
           "--set", f"kafka.sketch_group=metrics-sketch-{run_dir.parent.name}",
           "--set", f"sketch.metrics_port={ports['sketch']}", "--set", f"trainer.metrics_port={ports['trainer']}",
           "--set", f"serving.metrics_port={ports['serving']}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240

        def ready():  # all three up, a model served, a hot set published and applied
            pages = {k: try_scrape(p) for k, p in ports.items()}
            if any(p is None for p in pages.values()):
                return None
            ok = (value(pages["serving"], "streamrec_serving_up") == 1
                  and value(pages["sketch"], "streamrec_sketch_hot_sets_published", "streamrec_sketch_hot_sets_published_total") >= 1
                  and value(pages["trainer"], "streamrec_trainer_hot_set_version") >= 1
                  and value(pages["trainer"], "streamrec_trainer_events_trained", "streamrec_trainer_events_trained_total") > 0)
            return pages if ok else None

        first = None
        while first is None:
            assert proc.poll() is None, f"demo ended before its processes were scraped: {proc.communicate()[1][-4000:]}"
            assert time.monotonic() < deadline, "the pipeline did not come up in time"
            time.sleep(1.0)
            first = ready()
        cfg = tomllib.loads((run_dir / "config.toml").read_text())
        fields = [f["name"] for f in cfg["model"]["fields"]]
        event = {"dense": [0.1] * cfg["model"]["dense_dim"], "sparse": {f: 7 for f in fields}}
        with ServingClient(cfg["serving"]["target"]) as client:
            scores, _ = client.predict([event, event])
            assert len(scores) == 2
            with pytest.raises(grpc.RpcError) as e:  # a field the model does not have
                client.predict([{"dense": event["dense"], "sparse": {**event["sparse"], "nope": 1}}])
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        time.sleep(3.0)  # the next trainer metrics interval, more events counted
        second = {k: scrape(p) for k, p in ports.items()}
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=120)

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
