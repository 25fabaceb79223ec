"""`streamrec report` of a short run: run settings from its config, the served model's held-out AUC next to
the Bayes-optimal AUC, Predict latency percentiles, events/s, consumer lag over time and freshness by the
Kafka clock, from the few records a 20-second run writes."""

from __future__ import annotations

import json

from streamrec.app.evaluation import percentiles_ms, write_evaluation
from streamrec.app.report import write_report
from streamrec.app.config import Config, save_config


def test_report_of_a_short_run(tmp_path):
    recs = [{"ts": 100.0 + 2 * i, "events": 5000 * (i + 1), "auc": 0.6 + 0.01 * i, "window_auc": 0.7,
             "logloss": 0.6, "events_per_s": 2500.0 + i, "lag": [900, 400, 30, 0][i], "hot_fraction": 0.6,
             "hit_rate": 0.9, "snapshot_version": i, "freshness_kafka_s": 3.0 + i, "freshness_event_s": 9e7}
            for i in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    save_config(Config(), tmp_path / "config.toml")
    write_evaluation(tmp_path, {"events": 2000, "held_out": True, "served_version": 3, "served_auc": 0.7712,
                                "bayes_auc": 0.8391, "latency_calls": 200,
                                "predict_latency_ms": percentiles_ms([0.001, 0.002, 0.003, 0.010]),
                                "source": "generated", "produced": 20000, "produce_rate": 1000.0})
    png, md = write_report(tmp_path)
    text = md.read_text()
    assert png.exists() and png.stat().st_size > 10_000
    assert "## Run settings" in text and "| data | generated |" in text and "1,000 events/s" in text
    assert "4 sparse fields (user, item, category, tags)" in text
    assert "| served model's AUC, 2,000 held-out events via Predict (v3) | 0.7712 |" in text
    assert "| Bayes-optimal AUC of the same events (generated data: the ceiling) | 0.8391 |" in text
    assert "p50 2.50 ms" in text and "p99 9.79 ms" in text
    assert "| consumer lag, max / last (records) | 900 / 0 |" in text
    assert "| median training events/s | 2,502 |" in text
    assert "| median freshness, since the event entered Kafka (trained model) | 5.0 s |" in text
    assert "| run length (first to last record) | 6 s |" in text


def test_report_without_evaluation_or_config_still_reads(tmp_path):
    d = tmp_path
    (d / "metrics.jsonl").write_text(json.dumps({"ts": 1.0, "events": 10, "auc": 0.6}) + "\n")
    _, md = write_report(d)
    text = md.read_text()
    assert "Run settings" not in text and "Bayes-optimal" not in text and "| events trained | 10 |" in text


def test_report_and_metrics_endpoint_give_each_task_its_figures(tmp_path):
    from streamrec.trainer.telemetry import PrometheusExporter

    rec = {"ts": 1.0, "events": 1000, "auc": 0.71, "logloss": 0.6,
           "tasks": {"click": {"auc": 0.71, "logloss": 0.6, "labelled": 1000},
                     "conversion": {"auc": 0.64, "logloss": 0.18, "labelled": 97}}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    _, md = write_report(tmp_path)
    text = md.read_text()
    assert "| task conversion: progressive AUC / logloss since start (97 labelled events) | 0.6400 / 0.1800 |" in text
    assert "| task click: progressive AUC / logloss since start (1,000 labelled events) | 0.7100 / 0.6000 |" in text
    exporter = PrometheusExporter(0)  # in memory: nothing listens
    try:
        exporter.update(rec)
        reg = exporter.endpoint.registry
        assert reg.get_sample_value("streamrec_trainer_task_auc", {"task": "conversion"}) == 0.64
        assert reg.get_sample_value("streamrec_trainer_task_logloss", {"task": "click"}) == 0.6
        assert reg.get_sample_value("streamrec_trainer_task_labelled_events", {"task": "conversion"}) == 97
    finally:
        exporter.close()


def test_report_places_the_model_lines_after_the_results_once(tmp_path):
    from streamrec.app.report import lines_table

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"ts": 1.0, "events": 10, "auc": 0.6}) + "\n")
    table = lines_table({"lines": [{"model_line": "main", "share": 1.0, "version": 4}]})
    _, md = write_report(tmp_path, lines=table)
    text = md.read_text()
    assert text.count("# streamrec run") == 1 and text.count("## Results") == 1
    assert text.index("## Results") < text.index("## Model lines") < text.index("![run](report.png)")
    assert "| main | 100% | 4 |" in text
