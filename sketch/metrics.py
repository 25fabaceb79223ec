"""The sketch worker's Prometheus ``/metrics``: what it counted and skipped, its lag per partition,
and the hot sets it published.

Totals are the worker's own (``SketchState.stats``), read at scrape time; the lag and the last
published set are noted on the event loop (the publish timer) and only read by the scrape thread.
"""

from __future__ import annotations

from streamrec.foundation.prometheus import MetricsEndpoint

# WorkerStats field -> (metric name without _total, help)
_TOTALS = {
    "records": ("streamrec_sketch_records_consumed", "Kafka records counted"),
    "events": ("streamrec_sketch_events_consumed", "events counted into the popularity sketch"),
    "bad_records": ("streamrec_sketch_records_skipped", "malformed records skipped (the trainer dead-letters them)"),
    "skipped": ("streamrec_sketch_records_redelivered", "records skipped because a snapshot had counted them already"),
    "bad_times": ("streamrec_sketch_events_bad_time", "events not counted: their time is before 1970 or too far "
                                                      "ahead"),
    "quarantined": ("streamrec_sketch_records_quarantined", "records skipped because a worker died handling them"),
    "offsets_reset": ("streamrec_sketch_offsets_reset", "partitions moved by kafka.on_offsets_lost (the events topic "
                                                        "was deleted and recreated)"),
}


class SketchMetrics:
    def __init__(self, state, port: int, host: str = "127.0.0.1"):
        from prometheus_client import Counter

        self.state = state
        self.endpoint = MetricsEndpoint(port, host)
        self.published_total = Counter("streamrec_sketch_hot_sets_published", "hot sets published to the hot-set "
                                       "topic", registry=self.endpoint.registry)
        self.last = None  # the last HotSet published
        self.lag: dict[int, int] = {}  # partition -> records not counted yet
        self.topic = ""
        self.endpoint.collect_with(self._families)

    def start(self) -> "SketchMetrics":
        self.endpoint.start()
        return self

    @property
    def port(self) -> int:
        return self.endpoint.port

    def published(self, hs) -> None:
        self.last = hs
        self.published_total.inc()

    def observe_lag(self, consumer, topic: str) -> None:
        """Each owned partition's high watermark (from faust's last fetch) minus the next offset to count."""
        lag = {}
        for tp in consumer.assignment():
            if tp.topic != topic:
                continue
            try:
                hw = consumer.highwater(tp)
            except Exception:  # not fetched yet
                hw = None
            nxt = self.state.next_offset.get(tp.partition)
            if hw is not None and nxt is not None:
                lag[tp.partition] = max(0, int(hw) - int(nxt))
        self.topic, self.lag = topic, lag

    def _families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.state.stats
        for key, (name, doc) in _TOTALS.items():
            yield CounterMetricFamily(name, doc, value=getattr(st, key, 0))
        lag = GaugeMetricFamily("streamrec_sketch_partition_lag_records", "records of the partition not counted yet",
                                labels=["topic", "partition"])
        for p, n in sorted(dict(self.lag).items()):
            lag.add_metric([self.topic, str(p)], n)
        yield lag
        hs = self.last
        for name, doc, attr in (("streamrec_sketch_hot_set_version", "version of the last published hot set", "version"),
                                ("streamrec_sketch_hot_set_rows", "rows of the last published hot set", "rows"),
                                ("streamrec_sketch_hot_set_coverage", "fraction of sampled events the last published "
                                 "set covers entirely", "coverage"),
                                ("streamrec_sketch_hot_set_hit_rate", "fraction of sampled lookups the last published "
                                 "set serves", "hit_rate")):
            g = GaugeMetricFamily(name, doc)
            v = getattr(hs, attr, None) if hs is not None else None
            if isinstance(v, (int, float)) and v == v:
                g.add_metric([], float(v))
            yield g

    def close(self) -> None:
        self.endpoint.close()
