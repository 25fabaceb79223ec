"""The guard's live drift watch: the paired figure (mean |log-odds difference|, score ratio, standard error),
the guard's verdict on it (too few events: none), the book holding a waiting candidate that drifts (neither the
recovery count nor the settle rule promotes it) while one that does not drift settles, and over real gRPC on
127.0.0.1 a candidate with a shifted output bias held back as ``drift`` while live requests flow."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from streamrec.app.config import load_config
from streamrec.app.wiring import server_settings
from streamrec.serving import ServingClient, SnapshotPusher, events_to_request, serve
from streamrec.serving.drift import DriftFigures, log_odds
from streamrec.serving.guard import REASONS, Guard
from streamrec.serving.history import VersionBook
from tests.helpers.serving import FakeTrainer, Touched, make_events
from tests.serving.test_guard import _Version, _ev


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _pair(n, shift, rng, noise=0.0):
    """(candidate, promoted) scores of ``n`` events: the candidate's log-odds ``shift`` (+- ``noise``) away."""
    base = rng.normal(-1.0, 1.0, n)
    return _sigmoid(base + shift + rng.normal(0, noise, n)), _sigmoid(base)


def test_the_figure_is_the_mean_absolute_log_odds_difference_with_its_error_and_the_score_ratio():
    rng = np.random.default_rng(0)
    d = DriftFigures(candidate=3, promoted=1)
    assert d.mean_abs_logit == 0 and d.score_ratio == 0 and d.mean_abs_logit_se == float("inf")
    for shift in (0.5, -0.5):  # a shift either way counts as its size
        cand, prom = _pair(500, shift, rng)
        d.add(cand, prom)
    assert d.requests == 2 and d.events == 1000
    assert abs(d.mean_abs_logit - 0.5) < 1e-9 and d.mean_abs_logit_se < 1e-6
    c, p = _pair(2000, 0.0, rng, noise=1.0)
    e = DriftFigures(2, 1)
    e.add(c, p)
    diff = np.abs(log_odds(c) - log_odds(p))
    assert abs(e.mean_abs_logit - diff.mean()) < 1e-9
    assert abs(e.mean_abs_logit_se - diff.std(ddof=1) / np.sqrt(2000)) < 1e-9
    assert abs(e.score_ratio - c.sum() / p.sum()) < 1e-9
    f = e.figures()
    assert f["candidate_version"] == 2 and f["events"] == 2000 and f["score_ratio"] == e.score_ratio


def _guard(**kw) -> Guard:
    return Guard(load_config(None, {f"serving.guard.{k}": v for k, v in kw.items()}, env={}).serving.guard)


def _figures(n, shift, noise=0.0, seed=1) -> DriftFigures:
    d = DriftFigures(2, 1)
    d.add(*_pair(n, shift, np.random.default_rng(seed), noise))
    return d


def test_the_guard_holds_drift_clearly_beyond_its_bound_and_gives_no_verdict_on_too_few_events():
    g = _guard()
    assert g.cfg.drift_max == 1.0 and g.cfg.drift_min_events == 1000
    v = g.judge_drift(_figures(2000, 3.0))
    assert not v.ok and v.reason == "drift" and "live drift" in v.detail and "version 1" in v.detail
    assert REASONS.index("golden") < REASONS.index("drift") < REASONS.index("recovering")
    assert g.judge_drift(_figures(2000, 0.3, noise=0.3)).ok  # a clean successive version's size of change
    assert g.judge_drift(_figures(999, 3.0)).ok  # too few events: no verdict
    assert g.judge_drift(None).ok
    # just past the bound but within z standard errors of it: not clearly beyond
    near = _figures(1000, 0.0, noise=1.35, seed=4)
    assert 1.0 < near.mean_abs_logit < 1.0 + 3 * near.mean_abs_logit_se and g.judge_drift(near).ok
    assert _guard(drift_max=0).judge_drift(_figures(2000, 3.0)).ok  # 0: off
    assert _guard(enabled=False).judge_drift(_figures(2000, 3.0)).ok


def _book(tmp_path, now):
    cfg = load_config(None, {"serving.guard.settle_s": 60, "serving.guard.recovery_versions": 3}, env={})
    book = VersionBook(tmp_path, cfg.serving, cfg.store, clock=lambda: now[0])
    served = _Version(1, _ev())
    assert book.add(served, None).ok
    assert book.drift_candidate(1) == 0  # the head is the promoted version: nothing to pair
    assert book.add(_Version(2, _ev(label_rate=1.0)), served).reason == "label_rate"
    v3 = _Version(3, _ev())
    assert book.add(v3, served).reason == "recovering"
    assert book.drift_candidate(1) == 3 and book.drift_candidate(2) == 0  # only answers of the promoted version
    return book, served, v3


def _live(book, v, served, shift, events=1200, noise=0.2, per_request=100):
    rng = np.random.default_rng(7)
    pairs = [_pair(per_request, shift, rng, noise) for _ in range(events // per_request)]
    book.drift_seen(v, served.version, pairs, served)


def test_a_drifting_candidate_is_neither_settled_nor_recovery_promoted(tmp_path):
    now = [0.0]
    book, served, v3 = _book(tmp_path, now)
    _live(book, v3, served, shift=2.5)
    assert book.held_reason.startswith("drift: live drift") and book.held_total["drift"] == 1
    assert book.waiting_drift()["events"] == 1200 and book.waiting_drift()["mean_abs_logit_diff"] > 2
    state = json.loads((tmp_path / "serving-state.json").read_text())  # a restart keeps the hold and the count
    assert state["held_reason"].startswith("drift") and state["guard"]["passing"] == 0
    now[0] = 1000.0
    assert book.promote_settled(served) is None  # it never settles
    _live(book, v3, served, shift=2.5)  # more events of a held head: counted once
    assert book.held_total["drift"] == 1
    # the count starts again: the next two passing versions are not the three in a row the count wants
    assert "1 of 3" in book.add(_Version(4, _ev()), served).detail
    assert book.drift_candidate(1) == 4 and book.waiting_drift() is None  # the new head's figures start anew
    assert "2 of 3" in book.add(_Version(5, _ev()), served).detail
    assert book.add(_Version(6, _ev()), served).ok  # 3 of 3: promoted at its push, never waiting for live figures
    assert book.drift_candidate(6) == 0


def test_a_candidate_that_does_not_drift_or_has_too_few_events_settles_or_completes_the_count(tmp_path):
    now = [0.0]
    book, served, v3 = _book(tmp_path, now)
    _live(book, v3, served, shift=0.2)
    assert book.held_reason.startswith("recovering") and book.waiting_drift()["events"] == 1200
    now[0] = 61.0
    assert book.promote_settled(served) is v3
    now[0] = 0.0
    book, served, v3 = _book(tmp_path / "count", now)
    _live(book, v3, served, shift=0.2)
    assert "2 of 3" in book.add(_Version(4, _ev()), served).detail  # the count goes on
    assert book.add(_Version(5, _ev()), served).ok
    now[0] = 0.0
    book, served, v3 = _book(tmp_path / "few", now)
    _live(book, v3, served, shift=2.5, events=900)  # below drift_min_events: no verdict, today's rules
    assert book.held_reason.startswith("recovering")
    now[0] = 61.0
    assert book.promote_settled(served) is v3


def test_stale_pairs_are_dropped(tmp_path):
    now = [0.0]
    book, served, v3 = _book(tmp_path, now)
    _live(book, _Version(9, _ev()), served, shift=2.5)  # not the head
    _live(book, v3, _Version(7, _ev()), shift=2.5)  # not the promoted version
    assert book.drift is None and book.held_reason.startswith("recovering")


# -- over gRPC ------------------------------------------------------------------------------------
def _evidence(label_rate=0.2):
    from streamrec.snapshot import make_evidence, window

    w = window(2000, auc=0.75, logloss=0.45, label_rate=label_rate, mean_prediction=label_rate)
    return make_evidence(w, w, records=2000, field_novel_share={"user": 0.1})


class _Trainer(FakeTrainer):
    """Versions with evidence; ``shift`` is added to the model's output bias in the version written."""

    def __init__(self, cfg, tmp_path):
        super().__init__(cfg, tmp_path)
        self.touched = Touched()
        self.bias = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear)][-1].bias

    def next(self, shift: float = 0.0, label_rate: float = 0.2):
        changed = self.step(n_rows=80)
        self.touched.add(changed)
        with torch.no_grad():
            self.bias.add_(shift)
        try:
            snap = self.snapshot("full" if not self.version else "delta", changed, self.touched.rows())
        finally:
            with torch.no_grad():
                self.bias.sub_(shift)
        m = json.loads((snap / "manifest.json").read_text())
        m["evidence"] = _evidence(label_rate)
        (snap / "manifest.json").write_text(json.dumps(m))
        return snap


@pytest.mark.grpc
def test_a_candidate_with_a_shifted_output_is_held_on_live_drift_and_a_clean_one_settles(cfg, tmp_path):
    from streamrec.ingest import free_port

    cfg.serving.push_token = "push-tok"
    cfg.serving.metrics_port = free_port()
    cfg.serving.guard.settle_s = 2.0
    cfg.serving.guard.drift_min_events = 300
    t = _Trainer(cfg, tmp_path)
    request = events_to_request(make_events(cfg, 100, seed=5))

    def flow(c, n=6):  # live requests; the drift watch scores them off the answer path
        for _ in range(n):
            assert int(c.predict_request(request)[1]) == 1

    try:
        with serve(server_settings(cfg), device="cpu") as srv, SnapshotPusher(srv.target, token="push-tok") as p, \
                ServingClient(srv.target, push_token="push-tok") as c:
            assert p.push(t.next()).ok
            assert p.push(t.next(label_rate=1.0)).ok  # held: the count of passing versions starts
            assert c.status()["held_reason"].startswith("label_rate")
            assert p.push(t.next(shift=4.0)).ok  # passes its evidence, waits as recovering
            assert c.status()["held_reason"].startswith("recovering")
            flow(c)
            assert srv.service.lines.drain(10)
            st = c.status()
            assert st["held_reason"].startswith("drift: live drift"), st["held_reason"]
            d = st["drift"]
            assert int(d["candidate_version"]) == 3 and int(d["promoted_version"]) == 1
            assert int(d["events"]) >= 300 and d["mean_abs_logit_diff"] > 3 and d["score_ratio"] > 1.5
            assert st["lines"][0]["drift"]["events"] == d["events"]
            from streamrec.app.report import lines_table

            row = next(r for r in lines_table(st) if r.startswith("| main |"))
            assert row.endswith(f"| {d['mean_abs_logit_diff']:.3f}, {d['score_ratio']:.3f}, {d['events']} |")
            time.sleep(cfg.serving.guard.settle_s + 0.5)
            assert int(c.status()["version"]) == 1  # it never settled
            import urllib.request

            scrape = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics.port}/metrics", timeout=5).read().decode()
            assert 'streamrec_serving_versions_held_total{reason="drift"} 1.0' in scrape
            assert 'streamrec_serving_drift_events{line="main"}' in scrape
            # a clean candidate: it waits for the restarted count, drifts little, and settles
            assert p.push(t.next()).ok
            st = c.status()
            assert "1 of 3" in st["held_reason"] and "drift" not in st
            flow(c)
            assert srv.service.lines.drain(10)
            d = c.status()["drift"]
            assert int(d["candidate_version"]) == 4 and int(d["events"]) >= 300 and d["mean_abs_logit_diff"] < 1.0
            deadline = time.monotonic() + 10
            while int(c.status()["version"]) != 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            st = c.status()
            assert int(st["version"]) == 4 and st["held_reason"] == "" and "drift" not in st
    finally:
        t.close()
