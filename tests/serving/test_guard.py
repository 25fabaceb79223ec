"""The promotion guard on sequences of evidence blocks: a clean stream passes, each incident is held with its
reason named, promotion resumes when the evidence recovers, and an accept restarts the history; a dip within
the window's sampling error passes; a candidate worse on the golden set is held; a passing head settles; a
field that stops helping the ranking (a misaligned join) is held on its contribution while a clean wobble passes.
Also the evidence block's own checks (Manifest.check refuses a malformed one) and the trainer's collector."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.foundation import EventBatch, JaggedIds
from streamrec.app.config import load_config
from streamrec.serving.golden import GoldenSet
from streamrec.serving.guard import REASONS, Guard
from streamrec.serving.history import VersionBook
from streamrec.snapshot import (Contribution, EventSample, SnapshotError, check_evidence, make_evidence, read_evidence,
                                window)
from streamrec.trainer.evidence import SAMPLE_EVENTS, EvidenceCollector


def _ev(label_rate=0.2, mean_pred=0.2, logloss=0.45, events=2000, dense_zero=0.0, cols=(0.0, 0.05),
        empty=None, novel=None, dead=0, auc=0.75, logloss_var=0.3):
    w = window(events, auc=auc, logloss=logloss, label_rate=label_rate, mean_prediction=mean_pred,
               positives=int(round(label_rate * events)), logloss_var=logloss_var)
    return make_evidence(w, w, records=events, dead_letters=dead, dense_zero_share=dense_zero,
                         dense_column_zero_share=list(cols), field_empty_share=empty or {"user": 0.0, "item": 0.01},
                         field_novel_share=novel or {"user": 0.1, "item": 0.05})


def _guard(**kw) -> Guard:
    cfg = load_config(None, {f"serving.guard.{k}": v for k, v in kw.items()}, env={})
    g = Guard(cfg.serving.guard)
    return g


def _run(g: Guard, seq) -> list[str]:
    """Judge each block; promoted ones go into the history (as serving does). The reasons, "" = promoted."""
    out = []
    for ev in seq:
        v = g.judge(ev)
        if v.ok:
            g.promoted(ev)
        out.append(v.reason)
    return out


def test_a_clean_stream_with_noise_is_always_promoted():
    rng = np.random.default_rng(0)
    g = _guard()
    seq = [_ev(label_rate=0.2 + rng.normal(0, 0.01), mean_pred=0.2 + rng.normal(0, 0.01),
               logloss=0.45 + rng.normal(0, 0.01)) for _ in range(50)]
    assert _run(g, seq) == [""] * 50


@pytest.mark.parametrize("bad, reason", [
    (dict(label_rate=1.0, mean_pred=0.25, logloss=1.4), "label_rate"),  # (a) every label 1
    (dict(dense_zero=1.0, cols=(1.0, 1.0)), "dense_zeros"),  # (b) the dense vector all zeros
    (dict(cols=(0.95, 0.05)), "dense_zeros"),  # (b) one dense column turned to zeros
    (dict(novel={"user": 0.1, "item": 0.97}, logloss=0.5), "field_novel"),  # (c) a field's ids random
    (dict(empty={"user": 0.0, "item": 0.9}), "field_empty"),
    (dict(dead=500), "dead_letters"),
    (dict(mean_pred=0.4), "calibration"),
    (dict(logloss=0.6), "logloss"),
])
def test_an_incident_is_held_with_its_reason_and_promotion_resumes_after_it(bad, reason):
    g = _guard()
    reasons = _run(g, [_ev() for _ in range(5)] + [_ev(**bad) for _ in range(4)] + [_ev() for _ in range(3)])
    assert reasons[:5] == [""] * 5
    assert reasons[5:9] == [reason] * 4, reasons  # held from the first version after the incident began
    assert reasons[9:] == [""] * 3  # the evidence recovered: promoted again


def test_a_held_stretch_does_not_move_the_history():
    g = _guard()
    _run(g, [_ev() for _ in range(3)])
    before = g.state()
    assert _run(g, [_ev(label_rate=0.9, mean_pred=0.9, logloss=0.3)] * 20) == ["label_rate"] * 20
    assert g.state() == before


def test_accept_restarts_the_history_from_the_accepted_version():
    g = _guard()
    _run(g, [_ev() for _ in range(3)])
    shifted = _ev(label_rate=0.5, mean_pred=0.5, logloss=0.69)
    assert g.judge(shifted).reason == "label_rate"
    g.reset(shifted)  # `streamrec accept`: the stream really changed
    assert _run(g, [shifted] * 3) == [""] * 3


def test_few_events_since_the_previous_version_use_the_longer_window():
    g = _guard()
    _run(g, [_ev()] * 3)
    w_small = window(10, auc=0.5, logloss=5.0, label_rate=1.0, mean_prediction=0.01)
    w_long = window(20000, auc=0.75, logloss=0.45, label_rate=0.2, mean_prediction=0.2)
    assert g.judge(make_evidence(w_small, w_long, records=10)).ok  # 10 events: judged on the long window
    w_long_bad = window(20000, auc=0.75, logloss=0.45, label_rate=0.6, mean_prediction=0.2)
    assert g.judge(make_evidence(w_small, w_long_bad, records=10)).reason == "label_rate"


def test_disabled_guard_promotes_everything_and_the_verdict_names_every_failure():
    assert _run(_guard(enabled=False), [_ev(), _ev(label_rate=1.0)]) == ["", ""]
    g = _guard()
    _run(g, [_ev()])
    v = g.judge(_ev(label_rate=1.0, dense_zero=1.0, cols=(1.0, 1.0)))
    assert v.reason == "dense_zeros" and "label rate 1.000" in v.detail and "all-zero dense" in v.detail


def test_guard_state_round_trips():
    g = _guard()
    _run(g, [_ev(), _ev(label_rate=0.25)])
    h = _guard()
    h.load_state(g.state())
    assert h.state() == g.state()
    assert h.judge(_ev(label_rate=1.0)).reason == "label_rate"


@pytest.mark.parametrize("path, value, message", [
    (("since_previous", "auc"), 1.5, "since_previous.auc"),
    (("recent", "logloss"), float("nan"), "recent.logloss"),
    (("input", "dead_letter_share"), -0.1, "input.dead_letter_share"),
    (("input", "records"), 1.5, "input.records"),
    (("input", "field_novel_share"), {"user": "x"}, "input.field_novel_share.user"),
    (("since_previous", "extra"), 1, "unknown key"),
    (("format",), 2, "format"),
])
def test_a_malformed_evidence_block_is_refused_naming_the_key(path, value, message):
    ev = _ev()
    d = ev
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(SnapshotError, match=message.replace(".", r"\.")) as e:
        check_evidence(ev)
    assert e.value.code == "INVALID_ARGUMENT"


def test_the_collector_measures_labels_scores_and_input_health():
    c = EvidenceCollector(["click"], ["user", "item"], 2, recent_events=1000)
    rng = np.random.default_rng(1)
    c.observe_scores(np.zeros((0, 1), np.float32), np.zeros((0, 1), np.float32))  # nothing resolved: no-op

    def batch(n, zero_dense=False, random_item=False):
        ids = rng.integers(0, 50, n)
        item = rng.integers(0, 2**62, n) if random_item else rng.integers(0, 50, n)
        dense = np.zeros((n, 2), np.float32) if zero_dense else rng.normal(size=(n, 2)).astype(np.float32)
        offs = np.arange(n + 1, dtype=np.int64)
        return EventBatch(ts=np.zeros(n, np.int64), labels=(rng.random(n) < 0.3).astype(np.float32), dense=dense,
                          sparse={"user": JaggedIds(ids.astype(np.int64), offs),
                                  "item": JaggedIds(item.astype(np.int64), offs)})

    for _ in range(5):  # the recent memory of ids fills
        b = batch(400)
        c.observe_inputs(b)
        c.observe_scores(b.labels[:, None], np.full((len(b), 1), 0.3))
    c.take(0)
    b = batch(400)
    c.observe_inputs(b)
    c.observe_scores(b.labels[:, None], np.full((len(b), 1), 0.3))
    ev = c.take(4)
    assert read_evidence(ev.to_block()) == ev  # the manifest's form reads back as the same value
    assert len(ev.sample) == SAMPLE_EVENTS and set(ev.sample.labels) <= {0, 1}  # a sample of the 400 events
    assert set(ev.sample.ids) == {"user", "item"} and all(len(r) == 2 for r in ev.sample.dense)
    sp = ev.since_previous
    assert sp.positives == int(b.labels.sum()) and sp.logloss_var > 0
    assert sp.events == 400 and abs(sp.label_rate - b.labels.mean()) < 1e-9 and sp.mean_prediction == \
        pytest.approx(0.3)
    assert ev.recent.events == 1000  # bounded to trainer.metrics_window
    assert ev.input.dense_zero_share == 0 and ev.input.field_novel_share["item"] < 0.05
    assert ev.input.dead_letters == 4
    b = batch(400, zero_dense=True, random_item=True)
    c.observe_inputs(b)
    ev = c.take(4)
    assert ev.input.dense_zero_share == 1.0 and ev.input.dense_column_zero_share == (1.0, 1.0)
    assert ev.input.field_novel_share["item"] > 0.8 and ev.input.field_novel_share["user"] < 0.05
    assert ev.input.dead_letters == 0 and ev.since_previous.events == 0


def test_after_a_hold_several_passing_versions_in_a_row_are_needed():
    g = _guard(recovery_versions=3)
    for ev in [_ev()] * 3:
        assert g.decide(ev).ok
        g.promoted(ev)
    assert g.decide(_ev(label_rate=1.0)).reason == "label_rate"
    assert [g.decide(_ev()).reason for _ in range(2)] == ["recovering"] * 2
    assert g.decide(_ev(dense_zero=1.0, cols=(1.0, 1.0))).reason == "dense_zeros"  # the streak starts again
    assert [g.decide(_ev()).reason for _ in range(3)] == ["recovering", "recovering", ""]
    assert g.decide(_ev()).ok  # no hold since: promoted at once


def test_a_dip_within_the_windows_sampling_error_passes_and_an_incident_still_holds():
    """History AUC 0.75 / logloss 0.45 on 2000-event windows; a 1500-event window a little past the fixed
    margins (AUC -0.035 > 0.03, logloss +11% > 10%) is within 3 standard errors: held only with z = 0."""
    clean = [_ev() for _ in range(5)]
    dip_auc = _ev(events=1500, auc=0.715)
    dip_ll = _ev(events=1500, logloss=0.497, logloss_var=0.5)
    for dip, reason in ((dip_auc, "auc"), (dip_ll, "logloss")):
        old = _guard(z=0)  # the margins alone: what a fixed margin holds
        _run(old, clean)
        assert old.judge(dip).reason == reason
        g = _guard()
        _run(g, clean)
        assert g.judge(dip).ok, g.judge(dip).detail
    g = _guard()
    _run(g, clean)
    v = g.judge(_ev(auc=0.62))  # a damaged ranking: many standard errors below
    assert v.reason == "auc" and "SE" in v.detail
    assert g.judge(_ev(label_rate=0.5, mean_pred=0.5, logloss=0.69)).reason == "label_rate"  # a label flip
    assert g.judge(_ev(events=300_000, auc=0.74)).ok  # tiny SE: the margin still sets the least hold
    older = window(2000, auc=0.62, logloss=0.45, label_rate=0.2, mean_prediction=0.2)  # no counts, no variance
    assert read_evidence(make_evidence(older, older)).since_previous.labelled == (400, 1600)
    assert g.judge(make_evidence(older, older, records=2000)).reason == "auc"  # an older trainer's block


def test_a_bursty_streams_spread_widens_its_bounds_and_a_smooth_one_keeps_them():
    """Windows whose AUC varies by about 0.05 (a real stream's windows hold different users) make a dip of
    0.07 pass; on windows that agree to 0.002 the same dip is held, and a damaged ranking is held on both."""
    rng = np.random.default_rng(1)
    bursty, smooth = _guard(), _guard()
    for g, sd in ((bursty, 0.05), (smooth, 0.002)):
        for _ in range(30):
            ev = _ev(auc=0.75 + rng.normal(0, sd))
            if g.decide(ev).ok:
                g.promoted(ev)
    base = bursty.history.auc
    assert bursty.judge(_ev(auc=base - 0.07)).ok, bursty.judge(_ev(auc=base - 0.07)).detail
    assert smooth.judge(_ev(auc=smooth.history.auc - 0.07)).reason == "auc"
    for g in (bursty, smooth):
        assert g.judge(_ev(auc=g.history.auc - 0.3)).reason == "auc"
    state = bursty.state()
    again = _guard()
    again.load_state(state)
    assert again.history.auc_devs == bursty.history.auc_devs and len(again.history.auc_devs) == 29  # the first has no history


def _sample(n, rng):
    """Labelled events whose first dense feature predicts the label; the second is noise."""
    y = (rng.random(n) < 0.4).astype(int)
    dense = np.stack([y * 1.5 + rng.normal(0, 1, n), rng.normal(0, 1, n)], axis=1)
    return EventSample(tuple(y.tolist()), tuple(tuple(r) for r in dense.tolist()),
                       {"user": tuple((int(i),) for i in rng.integers(0, 99, n)), "item": ((),) * n})


def _scorer(col):
    return lambda batch: 1 / (1 + np.exp(-batch.dense[:, col:col + 1]))


def test_a_model_that_fitted_a_broken_stream_is_held_on_the_golden_set():
    rng = np.random.default_rng(3)
    good, broken = _scorer(0), _scorer(1)  # broken: learned from a misaligned field, its ranking is noise
    gs = GoldenSet(2000)
    for _ in range(4):  # promoted versions: each sample joins at the next promotion
        gs.promoted(_sample(300, rng), good, ["user", "item"], 2)
    assert len(gs) == 900
    for _ in range(6):
        gs.promoted(_sample(300, rng), good, ["user", "item"], 2)
    assert len(gs) <= 2000 and len(gs.parts) == 6  # bounded, the oldest out
    g = _guard()
    _run(g, [_ev() for _ in range(3)])
    fitted = _ev()  # its own window looks clean: it fits the stream it trained on
    c = gs.compare(broken)
    assert c.auc_delta < -0.2 and c.auc_se < 0.05
    v = g.decide(fitted, c)
    assert v.reason == "golden" and "golden-set AUC" in v.detail
    same = gs.compare(good)
    assert same.auc_delta == 0 and g.judge(fitted, same).ok
    assert _guard(golden_events=0).judge(fitted, c).ok  # no golden set: the check is off
    gs.promoted(_sample(300, rng), good, ["user"], 2)  # the schema changed: the set starts anew
    assert len(gs) == 0 and gs.compare(good) is None


class _Version:
    """What the book reads of a served version."""

    fields, dense_dim = ["user", "item"], 2

    def __init__(self, n, ev):
        self.version, self.manifest = n, type("M", (), {"evidence": ev})()

    def predict(self, batch):
        return np.full((len(batch), 1), 0.2)

    def retire(self, keep_dir=False):
        pass


def test_a_passing_head_settles_after_settle_s_with_the_recovery_count_short(tmp_path):
    now = [0.0]
    cfg = load_config(None, {"serving.guard.settle_s": 60, "serving.guard.recovery_versions": 3}, env={})
    book = VersionBook(tmp_path, cfg.serving, cfg.store, clock=lambda: now[0])
    served = _Version(1, _ev())
    assert book.add(served, None).ok
    assert book.add(_Version(2, _ev(label_rate=1.0)), served).reason == "label_rate"
    assert book.add(_Version(3, _ev()), served).reason == "recovering"
    now[0] = 59.0
    assert book.promote_settled(served) is None  # not yet
    now[0] = 30.0
    v4 = _Version(4, _ev())
    assert book.add(v4, served).reason == "recovering"  # a newer version: its own clock
    now[0] = 89.0
    assert book.promote_settled(served) is None
    now[0] = 91.0
    assert book.promote_settled(served) is v4 and book.held_reason == "" and book.kept[-1] is v4
    assert book.promote_settled(v4) is None  # once
    assert book.add(_Version(5, _ev()), v4).ok  # no hold since: promoted at once
    assert book.add(_Version(6, _ev(label_rate=1.0)), v4).reason == "label_rate"
    now[0] = 1000.0
    assert book.promote_settled(v4) is None  # a held head never settles


def test_the_settle_timer_asks_the_server_to_serve(tmp_path):
    import threading

    cfg = load_config(None, {"serving.guard.settle_s": 0.05}, env={})
    asked = threading.Event()
    book = VersionBook(tmp_path, cfg.serving, cfg.store, on_settle=asked.set)
    served = _Version(1, _ev())
    book.add(served, None)
    book.add(_Version(2, _ev(label_rate=1.0)), served)
    v3 = _Version(3, _ev())
    assert book.add(v3, served).reason == "recovering"
    assert asked.wait(5)
    assert book.promote_settled(served) is v3
    book.close()


def _fc_ev(item=0.025, item_se=0.007, user=0.01, events=1000, contribution=True):
    w = window(events, auc=0.75, logloss=0.45, label_rate=0.2, mean_prediction=0.2, positives=events // 5,
               logloss_var=0.3)
    fc = {"item": Contribution(item, item_se, events), "user": Contribution(user, 0.004, events)}
    return make_evidence(w, w, records=events, field_empty_share={"user": 0.0, "item": 0.0},
                         field_novel_share={"user": 0.1, "item": 0.05},
                         field_contribution=fc if contribution else None)


def test_a_field_that_stops_helping_the_ranking_is_held_and_a_clean_wobble_passes():
    rng = np.random.default_rng(0)
    g = _guard()
    clean = [_fc_ev(item=0.025 + rng.normal(0, 0.007)) for _ in range(20)]
    assert _run(g, clean) == [""] * 20  # the sampling noise of a clean window passes
    v = g.judge(_fc_ev(item=-0.02))  # the first misaligned window: its ids point at other events
    assert not v.ok and v.reason == "field_contribution" and "'item'" in v.detail
    assert g.judge(_fc_ev(item=0.0, item_se=0.001)).reason == "field_contribution"  # adapted: the field adds nothing
    assert g.judge(_fc_ev(item=0.012)).ok  # within 3 SE of the history
    assert g.judge(_fc_ev(item=0.0, item_se=0.001, events=100)).ok  # too few events to judge
    assert g.judge(_fc_ev(contribution=False)).ok  # an older trainer's block: the check is skipped
    assert _guard(field_contribution_margin=2).judge(_fc_ev(item=-0.02)).ok  # 2: never (a contribution is in [-1, 1])
    assert REASONS.index("auc") < REASONS.index("field_contribution") < REASONS.index("golden")


def test_a_field_is_judged_once_its_spread_is_known_and_only_when_it_contributes():
    g = _guard()
    _run(g, [_fc_ev() for _ in range(5)])
    assert g.judge(_fc_ev(item=-0.05)).ok  # 4 windows: how much this stream's windows differ is not known yet
    g = _guard()
    _run(g, [_fc_ev(user=0.004) for _ in range(20)])
    assert g.judge(_fc_ev(user=-0.03)).ok  # 'user' contributes less than the margin: its swings are not judged
    assert g.judge(_fc_ev(user=-0.03, item=-0.03)).reason == "field_contribution"


def _served(g: Guard, ev) -> bool:
    """``decide`` and, when it passes, ``promoted`` (as serving does); whether it passed."""
    v = g.decide(ev)
    if v.ok:
        g.promoted(ev)
    return v.ok


def test_a_field_low_in_two_successive_windows_is_held_at_the_second():
    """A drop of 2.5 SE passes alone (z_one is 3.2 for two judged fields) and is held when the previous window
    fell past z_two (1.94) too; a window back at the history in between clears it."""
    g = _guard()
    _run(g, [_fc_ev() for _ in range(20)])
    low = g.history.contribution["item"] - 2.5 * 0.007 * np.sqrt(2 / 1.8)
    assert _served(g, _fc_ev(item=low)) and g.history.contribution_low["item"]
    v = g.decide(_fc_ev(item=low))
    assert v.reason == "field_contribution" and "the previous window too" in v.detail
    h = _guard()
    _run(h, [_fc_ev() for _ in range(20)])
    assert [_served(h, _fc_ev(item=x)) for x in (low, 0.025, low)] == [True, True, True]
    h2 = _guard()
    h2.load_state(g.state())
    assert h2.history.contribution_low == g.history.contribution_low
    k = _guard()
    _run(k, [_fc_ev() for _ in range(20)])
    dip = _fc_ev(item=low)
    dip["since_previous"]["auc"] = 0.70  # the window's AUC 2.5 SE below its history too (one window, not two)
    v = k.judge(dip)
    assert v.reason == "field_contribution" and "the window's AUC too" in v.detail


def test_a_bursty_fields_spread_widens_its_bound_up_to_the_cap():
    """A field whose contribution swings by 0.05 from window to window (a real stream's windows hold different
    users) passes a dip of 0.06 that a steady field is held on; a fall to nothing is held on both."""
    rng = np.random.default_rng(1)
    bursty, steady = _guard(), _guard()
    for g, sd in ((bursty, 0.05), (steady, 0.002)):
        for _ in range(30):
            ev = _fc_ev(item=0.12 + rng.normal(0, sd), item_se=0.02)
            if g.decide(ev).ok:  # a held window's difference is kept for the spread too
                g.promoted(ev)
    for g in (bursty, steady):
        assert len(g.history.contribution_devs["item"]) == 29  # the first version has no history
    assert bursty.judge(_fc_ev(item=bursty.history.contribution["item"] - 0.06, item_se=0.02)).ok
    assert steady.judge(_fc_ev(item=steady.history.contribution["item"] - 0.07, item_se=0.02)).reason == \
        "field_contribution"
    for g in (bursty, steady):
        assert g.judge(_fc_ev(item=-0.03, item_se=0.02)).reason == "field_contribution"
    again = _guard()
    again.load_state(bursty.state())
    assert again.state() == bursty.state()


@pytest.mark.parametrize("value, message", [
    ({"item": {"contribution": 1.5, "se": 0.01, "events": 10}}, "field_contribution.item.contribution"),
    ({"item": {"contribution": 0.1, "se": float("nan"), "events": 10}}, "field_contribution.item.se"),
    ({"item": {"contribution": 0.1, "se": 0.01, "events": -1}}, "field_contribution.item.events"),
    ({"item": {"contribution": 0.1, "se": 0.01}}, "field_contribution.item"),
    ([1], "field_contribution"),
])
def test_a_malformed_contribution_is_refused_naming_the_key(value, message):
    ev = _fc_ev()
    ev["field_contribution"] = value
    with pytest.raises(SnapshotError, match=message.replace(".", r"\.")):
        check_evidence(ev)


def test_the_contribution_reads_back_and_an_older_block_reads_as_none():
    ev = read_evidence(_fc_ev())
    assert ev.field_contribution["item"] == Contribution(0.025, 0.007, 1000)
    assert read_evidence(_fc_ev(contribution=False)).field_contribution == {}
