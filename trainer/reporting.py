"""The metrics record a trainer publishes, and where it goes.

:class:`TrainerReporting` is the reporting part of :class:`~.service.TrainerService`: ``emit()`` builds
one record of the trainer's state (progressive metrics, throughput, the hot set's share, dead letters,
lag, snapshot and checkpoint progress, freshness) and publishes it to every sink, the JSON-lines log,
Prometheus and the progress line, keeping it as ``last_record``. A record's rates cover the time since
the previous record. It reads its host's parts: ``core``, ``consumer``, ``publisher`` (None: no
snapshots), ``store``, ``freshness``, ``seq``, ``rows_expired``, ``hot_coverage``, ``hit_rate`` (the
hot source's, the fallback while the store has seen no lookup), and the sinks ``metrics_log``,
``progress``, ``prom`` (None: no Prometheus endpoint), with ``_rate`` and ``_hot_at_log`` (events and
hot events at the previous record).

Tasks: ``auc``, ``logloss``, ``events_scored`` and the window figures are the first task's (a single-task
model's record is what it always was). A model of several tasks adds ``tasks: {name: {"auc", "logloss",
"labelled"}}`` to the record (each over the events that carry that task's label; null where not finite) and
flat ``auc.<task>`` / ``logloss.<task>`` keys to the snapshot's metrics (a manifest's metrics are numbers).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .metrics import finite

EVIDENCE_MEMORY = "evidence_memory"  # the checkpoint's dense key of the evidence's recent-id memory

if TYPE_CHECKING:
    from streamrec.snapshot import Evidence


class TrainerReporting:
    """``emit`` and its parts; a trainer group's rank builds its own record and publishes it the same way."""

    def _metric_values(self) -> dict[str, float]:
        """The metrics a snapshot's manifest carries (serving's Status reads them)."""
        m = self.core.metrics
        out = {"auc": m.auc, "logloss": m.logloss, "window_auc": m.window_auc(), "events": float(self.core.events),
               "newest_kafka_ms": float(self.freshness.newest_kafka_ms)}  # serving's Status: age by the Kafka clock
        figures = self.core.task_figures()
        if len(figures) > 1:
            for name, f in figures.items():
                out[f"auc.{name}"], out[f"logloss.{name}"] = f["auc"], f["logloss"]
        return out

    def _evidence(self) -> Evidence | None:
        """The quality evidence of the snapshot being built (``trainer/evidence.py``): what the trainer saw
        since the previous snapshot; None where this process collects none (a trainer group's other ranks:
        rank 0's own events are the group's evidence)."""
        ev = getattr(self, "evidence", None)
        return ev.take(self.consumer.stats.dead_letters) if ev is not None else None

    def _evidence_memory(self) -> dict[str, Any]:
        """The checkpoint's copy of the evidence's recent-id memory (where this process collects evidence)."""
        ev = getattr(self, "evidence", None)
        return {EVIDENCE_MEMORY: ev.memory_state()} if ev is not None else {}

    def _restore_evidence_memory(self, dense: dict[str, Any]) -> None:
        """Take the evidence's recent-id memory back from a checkpoint's dense part (none there: it starts empty)."""
        ev = getattr(self, "evidence", None)
        if ev is not None:
            ev.load_memory_state(dense.get(EVIDENCE_MEMORY))

    def emit(self) -> dict[str, Any]:
        """Build the record of the trainer's state now, publish it to every sink, and return it."""
        m = self.core.metrics
        ev0, hot0 = self._hot_at_log
        dn = self.core.events - ev0
        hot_fraction = (self.core.hot_events - hot0) / dn if dn else float("nan")
        self._hot_at_log = (self.core.events, self.core.hot_events)
        rec = {
            "ts": time.time(), "events": self.core.events, "auc": m.auc, "logloss": m.logloss, "events_scored": m.count,
            "window_auc": m.window_auc(), "window_logloss": m.window_logloss(),
            "events_per_s": self._rate.tick(self.core.events), "hot_fraction": hot_fraction,
            "hot_coverage": self.hot_coverage, "hit_rate": self._hit_rate(), "hot_version": self.core.hot_version,
            "hot_rows": self.core.hot_rows, "dead_letters": self.consumer.stats.dead_letters,
            "snapshot_version": self.publisher.version if self.publisher else 0,
            "replicas_behind": len(self.publisher.left_behind) if self.publisher else 0,
            "checkpoint": self.seq, "lag": self.consumer.lag(), "rows_expired": self.rows_expired,
            "rows_evicted": self.rows_evicted, "ids_unadmitted": self._unadmitted(),
            "nonfinite_batches": self.core.nonfinite_batches, "rejected_events": self.core.rejected_events,
            "commit_failures": self.consumer.stats.commit_failures, "rebalances": self.consumer.stats.rebalances,
            "offsets_reset": self.consumer.stats.offsets_reset, "quarantined": self.consumer.stats.quarantined,
            **self.freshness.record(self.core.newest_event_ms),
        }
        figures = self.core.task_figures()
        if len(figures) > 1:
            rec["tasks"] = {name: {k: finite(float(v)) if k != "labelled" else int(v) for k, v in f.items()}
                            for name, f in figures.items()}
        self._publish_record(rec)
        return rec

    def _publish_record(self, rec: dict[str, Any]) -> None:
        """One metrics record to every sink: the JSON-lines log, Prometheus, the progress line."""
        self.last_record = rec
        self.metrics_log.write(rec)
        if self.prom is not None:
            self.prom.update(rec)
        self.progress.update(rec)

    def _unadmitted(self) -> int:
        """Ids (one per training step) that read their table's unadmitted value (``store.admit_min_count``)."""
        try:
            return int(self.store.stats().get("admission_refused", 0))
        except Exception:
            return 0

    def _hit_rate(self) -> float:
        """The store's hot-tier hit rate; ``hit_rate`` while the store has seen no lookup or cannot say."""
        try:
            st = self.store.stats()
        except Exception:
            return self.hit_rate
        if isinstance(st, dict) and st.get("hot_hits", 0) + st.get("cold_hits", 0) == 0:
            return self.hit_rate  # no lookup yet: the store's 0.0 would read as "every lookup missed"
        for k in ("hot_hit_rate", "hit_rate"):
            v = st.get(k) if isinstance(st, dict) else getattr(st, k, None)
            if isinstance(v, (int, float)):
                return float(v)
        return self.hit_rate
