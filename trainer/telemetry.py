"""Where the trainer's numbers go: a JSON-lines log (read by the report tool),
Prometheus gauges on an HTTP port, and a live one-line progress display.

One record per interval; the same dict feeds all three sinks so they never disagree.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from .metrics import finite

# keys of one metrics-log record (the report tool reads these)
RECORD_KEYS = ("ts", "events", "auc", "logloss", "window_auc", "window_logloss", "events_per_s",
               "hot_fraction", "hot_coverage", "hit_rate", "hot_version", "dead_letters",
               "snapshot_version", "replicas_behind", "checkpoint", "lag", "nonfinite_batches", "rejected_events",
               "commit_failures", "rebalances", "offsets_reset", "quarantined")


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


class PrometheusExporter:
    """Gauges on ``/metrics``; a private registry so several trainers (tests) can coexist.

    Binds ``addr`` (``trainer.metrics_host``): loopback by default, so the endpoint is not on
    the network unless the operator says so (a container publishing the port binds 0.0.0.0)."""

    def __init__(self, port: int, addr: str = "127.0.0.1"):
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.gauges = {
            k: Gauge(f"streamrec_trainer_{k}", f"trainer {k.replace('_', ' ')}", registry=self.registry)
            for k in RECORD_KEYS if k not in ("ts", "checkpoint")
        }
        self.server = None
        self.port = port
        if port:
            self.server, _thread = start_http_server(port, addr=addr, registry=self.registry)
            self.port = self.server.server_port

    def update(self, record: dict[str, Any]) -> None:
        for k, g in self.gauges.items():
            v = record.get(k)
            if isinstance(v, (int, float)) and finite(float(v)) is not None:
                g.set(float(v))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class ProgressLine:
    """A live status line on a terminal (rich); silent when stderr is not a TTY."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._live = None
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, r: dict[str, Any]) -> None:
        if self._live is None:
            return

        def f(x, fmt):
            return format(x, fmt) if isinstance(x, (int, float)) and finite(float(x)) is not None else "-"

        self._live.update(
            f"[bold]train[/] events {r.get('events', 0):,}  {f(r.get('events_per_s'), ',.0f')} ev/s  "
            f"hot {f(r.get('hot_fraction'), '.1%')}  auc {f(r.get('auc'), '.4f')} "
            f"(win {f(r.get('window_auc'), '.4f')})  logloss {f(r.get('logloss'), '.4f')}  "
            f"lag {r.get('lag', '-')}  snap {r.get('snapshot_version') or '-'}"
        )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


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
