"""The joiner's Prometheus ``/metrics``: examples by outcome, the label delay, watermark lag, state rows,
late, orphan, duplicate and malformed records.

Totals are the joiner's own (``Joiner.totals()``), read at scrape time; the label delay histogram is
observed by the join as each counting action arrives; watermark lag is wall time minus each partition's
action watermark, noted by the agent."""

from __future__ import annotations

import time

from streamrec.foundation.prometheus import MetricsEndpoint

# JoinStats field -> (metric name without _total, help)
_TOTALS = {
    "impressions": ("streamrec_join_impressions", "impressions joined (first of their request_id)"),
    "duplicate_impressions": ("streamrec_join_impressions_duplicate", "impressions of a request_id already held"),
    "late_impressions": ("streamrec_join_impressions_late", "impressions older than the dedupe horizon: dropped"),
    "actions": ("streamrec_join_actions", "actions of a label type"),
    "ignored_actions": ("streamrec_join_actions_ignored", "actions of a type no task is labelled by"),
    "duplicate_actions": ("streamrec_join_actions_duplicate", "a task's repeated action"),
    "late_actions": ("streamrec_join_actions_late", "actions in the window that came after it closed"),
    "after_window_actions": ("streamrec_join_actions_after_window", "actions later than the window"),
    "orphan_actions": ("streamrec_join_actions_orphan", "actions whose impression never came within "
                                                        "join.orphan_wait_s"),
}


class JoinMetrics:
    def __init__(self, port: int, host: str = "127.0.0.1"):
        from prometheus_client import Histogram

        self.endpoint = MetricsEndpoint(port, host)
        self.joiner = None  # set once the app is built
        self.delay_s = Histogram("streamrec_join_label_delay_seconds", "event time from impression to its "
                                 "counting action", buckets=(1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 21600, 86400),
                                 registry=self.endpoint.registry)
        self.wm: dict[int, int] = {}  # partition -> action watermark (ms)
        self.endpoint.collect_with(self._families)

    def start(self) -> "JoinMetrics":
        self.endpoint.start()
        return self

    @property
    def port(self) -> int:
        return self.endpoint.port

    def delay(self, ms: int) -> None:
        self.delay_s.observe(ms / 1000.0)

    def watermark(self, p: int, wa_ms: int) -> None:
        self.wm[p] = wa_ms

    def _families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.joiner is None:
            return
        st = self.joiner.totals()
        for key, (name, doc) in _TOTALS.items():
            yield CounterMetricFamily(name, doc, value=getattr(st, key))
        ex = CounterMetricFamily("streamrec_join_examples", "examples written, by outcome", labels=["outcome"])
        for kind, n in sorted(st.examples.items()):
            ex.add_metric([kind], n)
        yield ex
        yield CounterMetricFamily("streamrec_join_records_malformed", "records dead-lettered",
                                  value=self.joiner.malformed)
        yield GaugeMetricFamily("streamrec_join_state_rows", "rows in the join state (this worker's partitions)",
                                value=st.rows)
        lag = GaugeMetricFamily("streamrec_join_watermark_lag_seconds", "wall time minus the partition's action "
                                "watermark", labels=["partition"])
        now = time.time() * 1000
        for p, wa in sorted(dict(self.wm).items()):
            lag.add_metric([str(p)], max(0.0, (now - wa) / 1000.0))
        yield lag

    def close(self) -> None:
        self.endpoint.close()
