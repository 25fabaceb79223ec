"""Where the trainer's numbers go: a JSON-lines log (read by the report tool),
Prometheus counters, gauges and histograms on an HTTP port, and a live one-line progress display.

One record per interval; the same dict feeds all three sinks so they never disagree.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from .metrics import finite

# keys of one metrics-log record (the report tool reads these)
RECORD_KEYS = ("ts", "events", "auc", "logloss", "window_auc", "window_logloss", "events_per_s",
               "hot_fraction", "hot_coverage", "hit_rate", "hot_version", "dead_letters",
               "snapshot_version", "replicas_behind", "checkpoint", "lag", "nonfinite_batches", "rejected_events",
               "commit_failures", "rebalances", "offsets_reset", "quarantined", "freshness_event_s",
               "freshness_kafka_s")


class MetricsLog:
    """Appends one JSON object per line; flushed per record so a crash loses at most the line being written."""

    def __init__(self, path: str):
        self.path = path
        self._f = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._f = open(path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        if self._f is None:
            return
        clean = {k: (finite(v) if isinstance(v, float) else v) for k, v in record.items()}
        self._f.write(json.dumps(clean, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# record key -> (metric name, help); counters mirror totals the trainer keeps (they only grow)
COUNTERS = {
    "events": ("streamrec_trainer_events_trained_total", "events trained on"),
    "rejected_events": ("streamrec_trainer_events_skipped_total",
                        "events not trained: their training step was not finite (they are dead-lettered)"),
    "dead_letters": ("streamrec_trainer_dead_letters_total", "records and events sent to the dead-letter topic"),
    "quarantined": ("streamrec_trainer_records_quarantined_total",
                    "records dead-lettered because a process died handling them (crash-loop breaker)"),
    "nonfinite_batches": ("streamrec_trainer_nonfinite_batches_total", "mini-batches whose step was not finite"),
    "checkpoint": ("streamrec_trainer_checkpoints_total", "durable checkpoints written (numbering continues a resume)"),
    "commit_failures": ("streamrec_trainer_commit_failures_total", "Kafka offset commits refused (retried)"),
    "rebalances": ("streamrec_trainer_rebalances_total", "consumer-group partition assignments after the first"),
    "offsets_reset": ("streamrec_trainer_offsets_reset_total", "partitions moved by kafka.on_offsets_lost"),
    "rows_expired": ("streamrec_trainer_rows_expired_total", "cold rows deleted by store.expire_after_s"),
    "rows_evicted": ("streamrec_trainer_rows_evicted_total", "rows deleted to keep tables within store.max_rows"),
    "ids_unadmitted": ("streamrec_trainer_ids_unadmitted_total",
                       "ids that read their table's unadmitted value (one per training step; store.admit_min_count)"),
}
GAUGES = {
    "auc": ("streamrec_trainer_auc", "progressive-validation AUC since start"),
    "logloss": ("streamrec_trainer_logloss", "progressive-validation log loss since start"),
    "window_auc": ("streamrec_trainer_window_auc", "AUC over the last trainer.metrics_window events"),
    "window_logloss": ("streamrec_trainer_window_logloss", "log loss over the last trainer.metrics_window events"),
    "events_per_s": ("streamrec_trainer_events_per_second", "events trained per second over the last interval"),
    "lag": ("streamrec_trainer_lag_records", "records in the assigned partitions not yet trained, all partitions"),
    "hot_version": ("streamrec_trainer_hot_set_version", "version of the hot set the trainer applied"),
    "hot_rows": ("streamrec_trainer_hot_set_rows", "rows in the applied hot set"),
    "hot_coverage": ("streamrec_trainer_hot_set_coverage", "fraction of sampled events the hot set covers entirely "
                                                           "(the sketch's estimate)"),
    "hot_fraction": ("streamrec_trainer_hot_event_fraction", "fraction of the last interval's events trained in hot "
                                                             "mini-batches"),
    "hit_rate": ("streamrec_trainer_hot_hit_rate", "fraction of embedding lookups served by the hot tier"),
    "snapshot_version": ("streamrec_trainer_snapshot_version", "newest snapshot version built"),
    "replicas_behind": ("streamrec_trainer_replicas_behind", "serving replicas the newest accepted snapshot missed"),
    "freshness_kafka_s": ("streamrec_trainer_freshness_kafka_seconds",
                          "now minus the Kafka timestamp of the newest trained record"),
    "freshness_event_s": ("streamrec_trainer_freshness_event_seconds",
                          "now minus the event time (ts) of the newest trained event"),
}


class PrometheusExporter:
    """The trainer's ``/metrics``: counters and gauges from each metrics record, the consumer's own
    counts and per-partition lag, and histograms of train-step, checkpoint and push durations.

    Binds ``addr`` (``trainer.metrics_host``): loopback by default, so the endpoint is not on
    the network unless the operator says so (a container publishing the port binds 0.0.0.0).
    ``port`` 0 keeps the metrics in memory only (nothing listens)."""

    def __init__(self, port: int, addr: str = "127.0.0.1"):
        from prometheus_client import Counter, Gauge, Histogram

        from streamrec.foundation.prometheus import DURATION_BUCKETS, LATENCY_BUCKETS, MetricsEndpoint

        self.endpoint = MetricsEndpoint(port, addr)
        reg = self.endpoint.registry
        self.counters = {k: Counter(name[: -len("_total")], doc, registry=reg) for k, (name, doc) in COUNTERS.items()}
        self._seen: dict[str, float] = {}
        self.gauges = {k: Gauge(name, doc, registry=reg) for k, (name, doc) in GAUGES.items()}
        self.step_seconds = Histogram("streamrec_trainer_train_step_seconds", "one mini-batch's training step "
                                      "(lookup, forward, backward, row and dense updates)", registry=reg,
                                      buckets=LATENCY_BUCKETS)
        self.checkpoint_seconds = Histogram("streamrec_trainer_checkpoint_seconds", "writing one durable checkpoint",
                                            registry=reg, buckets=DURATION_BUCKETS)
        self.push_seconds = Histogram("streamrec_trainer_push_seconds", "pushing one snapshot to one serving replica",
                                      registry=reg, buckets=DURATION_BUCKETS)
        self.task_gauges = {k: Gauge(f"streamrec_trainer_task_{k}", f"progressive-validation {doc} since start, "
                                     "per task, over the events that carry the task's label", ["task"], registry=reg)
                            for k, doc in (("auc", "AUC"), ("logloss", "log loss"))}
        self.task_labelled = Gauge("streamrec_trainer_task_labelled_events", "events scored for a task (they carry "
                                   "its label)", ["task"], registry=reg)
        self.pushes = Counter("streamrec_trainer_pushes", "snapshot pushes by outcome (OK, a gRPC status, or error: "
                              "not delivered)", ["result"], registry=reg)
        self._consumer = None
        self.endpoint.collect_with(self._consumer_families)
        self.endpoint.start()
        self.server = self.endpoint.server
        self.port = self.endpoint.port

    def update(self, record: dict[str, Any]) -> None:
        for k, c in self.counters.items():
            v = record.get(k)
            if isinstance(v, (int, float)) and finite(float(v)) is not None:
                grown = float(v) - self._seen.get(k, 0.0)
                if grown > 0:  # a counter never goes down (a group's sum may dip when a rank restarts)
                    c.inc(grown)
                    self._seen[k] = float(v)
        for k, g in self.gauges.items():
            v = record.get(k)
            if isinstance(v, (int, float)) and finite(float(v)) is not None:
                g.set(float(v))
        for task, figures in (record.get("tasks") or {}).items():  # a model of several tasks
            for k, g in self.task_gauges.items():
                v = figures.get(k)
                if isinstance(v, (int, float)) and finite(float(v)) is not None:
                    g.labels(task=task).set(float(v))
            if isinstance(figures.get("labelled"), int):
                self.task_labelled.labels(task=task).set(figures["labelled"])

    def watch_consumer(self, consumer) -> None:
        """Export the consumer's counts and ``last_lag`` (plain values: read from the scrape thread, never the
        Kafka client itself, which is not thread-safe)."""
        self._consumer = consumer

    def _consumer_families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self._consumer
        if c is None:
            return
        st = c.stats
        yield CounterMetricFamily("streamrec_trainer_events_consumed", "events decoded from Kafka", value=st.events)
        yield CounterMetricFamily("streamrec_trainer_records_consumed", "Kafka records read", value=st.records)
        yield CounterMetricFamily("streamrec_trainer_consumed_bytes", "bytes of Kafka records read", value=st.bytes)
        lag = GaugeMetricFamily("streamrec_trainer_partition_lag_records", "records of the partition not yet handed "
                                "to training (at the last metrics interval)", labels=["topic", "partition"])
        for p, n in sorted(dict(getattr(c, "last_lag", {}) or {}).items()):
            lag.add_metric([c.topic, str(p)], n)
        yield lag

    def timed_pushers(self, factory):
        """``factory`` with every pusher it makes timed and counted (None stays None)."""
        if factory is None:
            return None

        def make(target):
            return _TimedPusher(factory(target), self)
        return make

    def close(self) -> None:
        self.endpoint.close()
        self.server = None


class _TimedPusher:
    def __init__(self, inner, exporter: PrometheusExporter):
        self.inner, self.exporter = inner, exporter

    def push(self, snapshot_dir):
        t0 = time.perf_counter()
        result = "error"
        try:
            res = self.inner.push(snapshot_dir)
            result = "OK" if res.ok else str(res.code)
            return res
        finally:
            self.exporter.push_seconds.observe(time.perf_counter() - t0)
            self.exporter.pushes.labels(result).inc()

    def close(self) -> None:
        self.inner.close()


class ProgressLine:
    """A live status line on a terminal (rich); without a TTY (a container, a service manager) the same
    line is logged every ``interval_s`` instead, so a log shows the trainer is alive and how far it got.
    ``enabled=False`` (``--no-progress``) shows neither."""

    def __init__(self, enabled: bool | None = None, interval_s: float = 10.0):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._live = None
        self._log_every = interval_s if enabled is None and not self.enabled else 0.0
        self._logged = time.monotonic()
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.start()

    @staticmethod
    def text(r: dict[str, Any]) -> str:
        def f(x, fmt):
            return format(x, fmt) if isinstance(x, (int, float)) and finite(float(x)) is not None else "-"

        return (f"events {r.get('events', 0):,}  {f(r.get('events_per_s'), ',.0f')} ev/s  "
                f"hot {f(r.get('hot_fraction'), '.1%')}  auc {f(r.get('auc'), '.4f')} "
                f"(win {f(r.get('window_auc'), '.4f')})  logloss {f(r.get('logloss'), '.4f')}  "
                f"lag {r.get('lag', '-')}  snap {r.get('snapshot_version') or '-'}  "
                f"age {f(r.get('freshness_kafka_s'), '.1f')} s")

    def update(self, r: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(f"[bold]train[/] {self.text(r)}")
        elif self._log_every and time.monotonic() - self._logged >= self._log_every:
            self._logged = time.monotonic()
            logging.getLogger("streamrec.train").info("progress: %s", self.text(r))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class Freshness:
    """How old the newest trained event is, by two clocks.

    ``freshness_event_s``: now minus the event's own ``ts`` (what the model knows of the world's time; a
    replay of old or generated data reads years). ``freshness_kafka_s``: now minus the record timestamp of
    the newest trained record, i.e. when it entered Kafka: how far the model is behind the stream, whatever
    the events' own times. Snapshots carry ``newest_kafka_ms`` in their metrics, so serving's Status gives
    the served model's age by the same clock."""

    def __init__(self):
        self.newest_kafka_ms = 0

    def observe(self, batch) -> None:
        self.newest_kafka_ms = max(self.newest_kafka_ms, int(getattr(batch, "source_newest_ms", 0) or 0))

    def record(self, newest_event_ms: int, now_ms: float | None = None) -> dict[str, float]:
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        return {"freshness_event_s": age_s(newest_event_ms, now_ms), "freshness_kafka_s": age_s(self.newest_kafka_ms, now_ms)}


def age_s(stamp_ms: float, now_ms: float | None = None) -> float:
    """Seconds since ``stamp_ms`` (never negative: clocks of two machines differ); NaN when unknown (0)."""
    if not stamp_ms or stamp_ms <= 0:
        return float("nan")
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    return max(0.0, (now_ms - float(stamp_ms)) / 1000.0)


class Rate:
    """Events per second over the last interval."""

    def __init__(self):
        self.t = time.monotonic()
        self.n = 0

    def tick(self, total: int) -> float:
        now = time.monotonic()
        dt = max(now - self.t, 1e-9)
        r = (total - self.n) / dt
        self.t, self.n = now, total
        return r
