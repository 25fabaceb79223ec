"""The serving endpoint's Prometheus ``/metrics``.

Predict and PushSnapshot calls are counted by their final gRPC status code and timed by a
server interceptor placed outside the admission lanes, so a call refused by a full lane or by a
limit counts too (with its code) and the latency is what a client waited for, refusals included.
The served model (version, rows, age) and totals the service keeps are read at scrape time.
"""

from __future__ import annotations

import time

import grpc

from streamrec.foundation.prometheus import DURATION_BUCKETS, LATENCY_BUCKETS, MetricsEndpoint

from .pb import SERVICE

_TIMED = {f"/{SERVICE}/Predict": "predict", f"/{SERVICE}/PushSnapshot": "push"}


class ServingMetrics(grpc.ServerInterceptor):
    """Counters, histograms and gauges of one :class:`~.server.StreamRecService`; also the interceptor."""

    def __init__(self, service, port: int, host: str = "127.0.0.1"):
        from prometheus_client import Counter, Histogram

        self.service = service
        self.endpoint = MetricsEndpoint(port, host)
        reg = self.endpoint.registry
        self.calls = {
            "predict": Counter("streamrec_serving_predict_requests", "Predict calls by final gRPC status code",
                               ["code"], registry=reg),
            "push": Counter("streamrec_serving_pushes", "PushSnapshot calls by final gRPC status code", ["code"],
                            registry=reg),
        }
        self.seconds = {
            "predict": Histogram("streamrec_serving_predict_latency_seconds", "Predict latency on the server, from "
                                 "arrival to answer (refusals included)", registry=reg, buckets=LATENCY_BUCKETS),
            "push": Histogram("streamrec_serving_push_seconds", "one PushSnapshot: receive, verify, load, swap",
                              registry=reg, buckets=DURATION_BUCKETS),
        }
        for c in self.calls.values():  # OK shows as 0 before the first call: rate() works from the start
            c.labels("OK")
        self.endpoint.collect_with(self._served)

    @property
    def port(self) -> int:
        return self.endpoint.port

    def start(self) -> "ServingMetrics":
        self.endpoint.start()
        return self

    def close(self) -> None:
        self.endpoint.close()

    # -- the interceptor ---------------------------------------------------------
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        kind = _TIMED.get(handler_call_details.method)
        if handler is None or kind is None:
            return handler
        attr = "stream_unary" if handler.request_streaming else "unary_unary"
        behavior = getattr(handler, attr)
        calls, seconds = self.calls[kind], self.seconds[kind]

        def run(request, context):
            t0 = time.perf_counter()
            code = "UNKNOWN"
            try:
                out = behavior(request, context)
                code = _code_name(context) or "OK"
                return out
            except BaseException:
                code = _code_name(context) or "UNKNOWN"
                raise
            finally:
                seconds.observe(time.perf_counter() - t0)
                calls.labels(code).inc()

        pool = getattr(behavior, "experimental_thread_pool", None)
        if pool is not None:  # the admission lane the call runs in (serving/admission.py)
            run.experimental_thread_pool = pool
        make = getattr(grpc, f"{attr}_rpc_method_handler")
        return make(run, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    # -- read at scrape time -------------------------------------------------------
    def _served(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        svc = self.service
        yield CounterMetricFamily("streamrec_serving_swaps", "model versions swapped in (pushes and the restore at "
                                  "start)", value=getattr(svc, "swaps", 0))
        yield CounterMetricFamily("streamrec_serving_events_scored", "events scored by Predict",
                                  value=svc.events_served)
        yield CounterMetricFamily("streamrec_serving_stored_versions_damaged", "stored versions refused because a "
                                  "file differs from its record at install (at start or before a delta on them)",
                                  value=getattr(svc, "stored_refused", 0))
        yield CounterMetricFamily("streamrec_serving_stored_verify_seconds", "time spent hashing stored versions' "
                                  "files (once per file at start and per delta)", value=getattr(svc, "verify_s", 0.0))
        yield CounterMetricFamily("streamrec_serving_stored_verify_bytes", "bytes hashed verifying stored versions",
                                  value=getattr(svc, "verify_bytes", 0))
        v = svc.current
        yield GaugeMetricFamily("streamrec_serving_up", "1 while a model is served", value=1 if v is not None else 0)
        version = GaugeMetricFamily("streamrec_serving_model_version", "version of the served model")
        rows = GaugeMetricFamily("streamrec_serving_model_rows", "embedding rows the served version holds")
        event_age = GaugeMetricFamily("streamrec_serving_freshness_event_seconds", "now minus the event time (ts) "
                                      "of the newest event the served model learned from")
        kafka_age = GaugeMetricFamily("streamrec_serving_freshness_kafka_seconds", "now minus the Kafka timestamp "
                                      "of the newest record the served model learned from")
        if v is not None:
            m = v.manifest
            now_ms = time.time() * 1000
            version.add_metric([], v.version)
            rows.add_metric([], v.rows_held)
            if m.newest_event_ms:
                event_age.add_metric([], max(0.0, (now_ms - m.newest_event_ms) / 1000))
            kafka_ms = float((m.metrics or {}).get("newest_kafka_ms", 0) or 0)
            if kafka_ms > 0:
                kafka_age.add_metric([], max(0.0, (now_ms - kafka_ms) / 1000))
        yield from (version, rows, event_age, kafka_age)
        book = getattr(svc, "book", None)
        if book is not None:  # the guard, rollbacks and pins (history.py)
            held = CounterMetricFamily("streamrec_serving_versions_held", "versions the promotion guard held back "
                                       "(installed, not served), by the check that failed", labels=["reason"])
            for reason, n in sorted(book.held_total.items()):
                held.add_metric([reason], n)
            yield held
            yield CounterMetricFamily("streamrec_serving_rollbacks", "rollbacks an operator asked for",
                                      value=book.rollbacks)
            yield GaugeMetricFamily("streamrec_serving_pinned", "1 while a rollback pins the served version",
                                    value=1 if book.pinned else 0)
            yield GaugeMetricFamily("streamrec_serving_held", "1 while the guard holds the newest version back",
                                    value=1 if book.held_reason else 0)
            yield GaugeMetricFamily("streamrec_serving_newest_version", "newest version installed (served or not)",
                                    value=book.head.version if book.head is not None else 0)
        lines = getattr(svc, "lines", None)
        if lines is not None:
            yield from _line_families(lines.figures(), {n: lines.service(n).current for n in lines.names})
            yield from _drift_families(lines)


def _drift_families(lines):
    """Each line's waiting candidate against its promoted version on live requests (label ``line``; drift.py)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    fams = {"events": GaugeMetricFamily("streamrec_serving_drift_events", "live events the newest version, while "
                                        "it waits, scored beside the promoted version", labels=["line"]),
            "mean_abs_logit_diff": GaugeMetricFamily("streamrec_serving_drift_mean_abs_logit_diff", "mean |log-odds "
                                                     "difference| of the waiting version's and the promoted "
                                                     "version's live scores", labels=["line"]),
            "score_ratio": GaugeMetricFamily("streamrec_serving_drift_score_ratio", "mean waiting-version score / "
                                             "mean promoted score on the same live events", labels=["line"])}
    for name in lines.names:
        f = lines.service(name).book.waiting_drift()
        if f is not None:
            for key, fam in fams.items():
                fam.add_metric([name], f[key])
    yield from fams.values()
    yield CounterMetricFamily("streamrec_serving_drift_skipped", "answered requests not scored by the waiting "
                              "version: serving.shadow_max_pending were waiting", value=lines.drift.skipped)


def _line_families(figs: dict, served: dict):
    """Per model line (label ``line``) and per shadow pair (labels ``line``, ``shadow``): see lines.py."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    fams = {
        "requests": CounterMetricFamily("streamrec_serving_line_requests", "Predict calls each model line answered",
                                        labels=["line"]),
        "seconds": CounterMetricFamily("streamrec_serving_line_latency_seconds", "time from a Predict call's "
                                       "parse to its answer, summed per answering line", labels=["line"]),
        "events": CounterMetricFamily("streamrec_serving_line_events", "events each line scored for answers",
                                      labels=["line"]),
        "mean_score": GaugeMetricFamily("streamrec_serving_line_mean_score", "mean first-task score each line "
                                        "returned", labels=["line"]),
        "fallbacks": CounterMetricFamily("streamrec_serving_line_fallbacks", "calls the split routed to a line "
                                         "without a model yet, answered by main", labels=["line"]),
    }
    version = GaugeMetricFamily("streamrec_serving_line_version", "version each line serves (0: none yet)",
                                labels=["line"])
    for name, f in figs["lines"].items():
        for key, fam in fams.items():
            fam.add_metric([name], f[key])
    for name, v in served.items():
        version.add_metric([name], v.version if v is not None else 0)
    yield from (*fams.values(), version)
    pair = {"events": CounterMetricFamily("streamrec_serving_shadow_events", "events scored by the shadow line "
                                          "and the answering line", labels=["line", "shadow"]),
            "mean_abs_diff": GaugeMetricFamily("streamrec_serving_shadow_mean_abs_diff", "mean |shadow score - "
                                               "answered score|", labels=["line", "shadow"]),
            "disagree_share": GaugeMetricFamily("streamrec_serving_shadow_disagree_share", "share of events whose "
                                                "two scores differ by more than 0.1", labels=["line", "shadow"]),
            "calibration": GaugeMetricFamily("streamrec_serving_shadow_calibration", "mean shadow score / mean "
                                             "answered score", labels=["line", "shadow"])}
    for key, f in figs["shadow"].items():
        line, shadow = key.split("/")
        for k, fam in pair.items():
            fam.add_metric([line, shadow], f[k])
    yield from pair.values()
    yield CounterMetricFamily("streamrec_serving_shadow_skipped", "requests not shadow-scored: "
                              "serving.shadow_max_pending were waiting", value=figs["shadow_skipped"])


def _code_name(context) -> str | None:
    try:
        code = context.code()
    except Exception:  # a gRPC without ServicerContext.code()
        return None
    return code.name if isinstance(code, grpc.StatusCode) else None
