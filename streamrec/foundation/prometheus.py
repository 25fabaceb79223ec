"""How every streamrec process serves Prometheus ``/metrics``: a private registry on ``host:port``.

A private registry (not prometheus_client's global one) so several processes' worth of metrics
can live in one Python process (tests, the demo) without clashing. Loopback by default: the
endpoint is on the network only when the operator binds it there (``0.0.0.0`` in containers).
Names follow Prometheus conventions: ``streamrec_<process>_<what>[_<unit>]``, counters end in
``_total``, durations are histograms in seconds.
"""

from __future__ import annotations

from typing import Callable, Iterable

# buckets (seconds) for the durations the processes export: sub-millisecond Predict calls to minute-long pushes
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MetricsEndpoint:
    """A registry and, when ``port`` > 0, an HTTP server for it (``port`` becomes the bound one)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1"):
        import prometheus_client
        from prometheus_client import CollectorRegistry

        prometheus_client.disable_created_metrics()  # no *_created series beside every counter and histogram
        self.registry = CollectorRegistry()
        self.server = None
        self.port = port
        self.host = host

    def start(self) -> "MetricsEndpoint":
        from prometheus_client import start_http_server

        if self.port and self.server is None:
            self.server, _thread = start_http_server(self.port, addr=self.host, registry=self.registry)
            self.port = self.server.server_port
        return self

    def collect_with(self, fn: Callable[[], Iterable]) -> None:
        """Add metric families computed at scrape time by ``fn`` (values another object already keeps)."""
        self.registry.register(_Callback(fn))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Callback:
    def __init__(self, fn: Callable[[], Iterable]):
        self._fn = fn

    def collect(self):
        return list(self._fn())

    def describe(self):
        return []  # computed at scrape time: nothing to check against other collectors at registration
