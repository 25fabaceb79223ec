"""The promotion guard: whether a pushed version's quality evidence lets it reach users (``[serving.guard]``).

A version is judged on the evidence its manifest carries, read as a ``streamrec.snapshot.Evidence``: what the trainer
saw since the previous version. The checks, in the order a hold names them (the first that fails is the
reason, every failing one is in the detail):

- ``dead_letters``: more than ``dead_letter_share_max`` of the records since the previous version were
  dead-lettered;
- ``dense_zeros``: the share of all-zero dense vectors, or of zeros in one dense column, is more than
  ``zero_share_jump`` above its history;
- ``field_empty`` / ``field_novel``: a field's share of events without ids, or of ids the trainer has not
  seen lately (random ids look like this), is more than ``empty_share_jump`` / ``novel_share_jump`` above
  its history;
- ``label_rate``: the label rate is off its history by more than ``label_rate_tolerance`` of it (or
  ``label_rate_floor``, whichever is larger);
- ``calibration``: mean prediction / label rate outside ``[calibration_min, calibration_max]``;
- ``logloss``: the progressive logloss is more than ``logloss_margin`` (a share) above its history;
- ``auc``: the progressive AUC is more than ``auc_margin`` below its history (a model whose ranking was
  damaged, by an incident it has since been trained past, keeps a worse AUC after its calibration and logloss
  have recovered);
- ``field_contribution``: a field's contribution to the ranking on the window (the model's AUC minus its AUC
  with that field's ids removed, paired on the same events, measured by the trainer before it learnt them:
  ``manifest.evidence.field_contribution``) is more than ``field_contribution_margin`` below its history. A
  field whose ids stopped belonging to their events (a misaligned upstream join) stops helping the ranking at
  once, while the window's AUC and the golden set move by less than their noise;
- ``golden``: on serving's golden set (``golden.py``: labelled events of windows whose versions were
  promoted), the candidate's AUC is more than ``golden_auc_margin`` below the promoted version's on the same
  events, or its logloss more than ``golden_logloss_margin`` (a share) above it. A model that has fitted a
  broken stream passes its own window; this check holds it whatever its window says.

**Noise.** A window of a few thousand events measures AUC, logloss and label rate with a sampling error
close to the margins, so a fixed margin holds good versions on chance dips. Each label and score check
(and ``golden``) holds a version only when it is both *practically* worse (the difference exceeds its
margin above, which stays the least difference worth a hold) and *statistically* worse (the difference
exceeds ``z`` standard errors of the window it was measured on, ``streamrec.foundation.noise``): a hold needs
``difference > max(margin, z * SE)``. SE is Hanley-McNeil's for AUC (the window's positive and negative
counts), sqrt(per-event loss variance / n) for logloss, the binomial sqrt(p(1-p)/n) for the label rate (at
the history's rate) and for calibration its relative form on log(mean prediction / label rate), which is
held only when also more than ``z`` relative errors from 1; a window's SE is scaled by sqrt(2 / (2 -
history_weight)) for the noise of the history it is compared with. On ``golden`` the SE is that of the paired
difference (DeLong for AUC); on ``field_contribution`` the trainer's DeLong SE of the paired contribution. A
test on each window, rather than a sequential test across versions, keeps each verdict a function of one version's evidence and the promoted history, so an incident is held at its
first version as before: an incident's differences are many standard errors wide. An evidence block of an
older trainer (no positive count, no logloss variance) has its counts derived from its label rate and its
logloss judged on the margin alone.

A real stream's windows also differ by what they hold (which users, which items), beyond sampling: the
guard keeps the last ``SPREAD_WINDOWS`` judged windows' AUC, logloss and per-field contribution differences
from their histories (held windows too, else the bound that holds them would hide the spread it should learn) and, once
``SPREAD_VERSIONS`` are in, uses their robust standard deviation (1.4826 median absolute difference, which
an incident covering fewer than half of them barely moves) where it is wider than the window's sampling
error, up to ``SPREAD_CAP`` times that error: a stream's spread may be inflated by a long incident whose
windows are among the last ``SPREAD_WINDOWS``, and the cap keeps such an incident above the bound (once a
model has fitted a misaligned join, the field adds nothing and its paired error is tiny, which keeps the
bound tight). A smooth
stream keeps its tight sampling bounds; a bursty one is judged against how much its windows vary; the
golden set and the input and label checks do not widen with it.

The label and score checks read the since-previous window when it holds at least ``min_events`` labelled
events, else the trainer's longer window; with fewer than that in both they are skipped (a trainer that has
just started). The histories are exponentially weighted averages (``history_weight`` per version; an input
share's history follows a fall at ``DOWN_WEIGHT``, so a fresh trainer's all-new ids do not set a high
baseline) over the promoted versions only, so a held stretch never moves them: the guard compares every new version with what
users were last given. ``reset`` (an operator's ``streamrec accept``) starts them again from one version's
evidence: the stream really changed. The first version a server gets is promoted whatever it holds (nothing
else could be served) and starts the histories.

**Field contribution.** A field is judged when its figure was measured on at least
``CONTRIBUTION_MIN_EVENTS`` events, its history shows it contributes at least ``field_contribution_margin``
(an unimportant field's contribution swings around zero on a real stream, its embeddings fitted to few
events, and its loss would cost the ranking less than the margin) and ``SPREAD_VERSIONS`` of its windows
have given its spread (a real stream's windows differ in how much a field helps, far beyond the paired SE,
and the check cannot tell noise before it knows by how much). Every judged field is one test, so ``z`` is
raised to the Bonferroni value for their number (``z_one``): a version's chance of a false hold on this
check stays that of one test at ``z``. A field also fails when this window and its previous judged one both
fall past ``z_two``, the bound two successive windows pass together as often as one window passes
``z_one`` (``Phi(-z_two)**2 = Phi(-z_one)``), and likewise when it falls past ``z_two`` while the window's
AUC falls more than ``z_two`` of its SE (the ``auc`` check's) below its history: on a real stream one window
in fifty may show a field helping little (a burst of one user's events) or a low AUC, each alone, while a
misaligned join lowers both and keeps the field low window after window. A block
without the figures (an older trainer's, a trainer group's) skips the check.

**Live drift** (``judge_drift``, reason ``drift``): while a candidate waits to be promoted, serving pairs its
scores with the promoted version's on live requests (``drift.py``). The candidate fails when the mean
``|log-odds difference|`` over at least ``drift_min_events`` paired events is more than ``drift_max`` plus
``z`` standard errors. The default sits well above what successive versions of a clean stream differ by, even
many versions apart (``streamrec bench quality --drift``, BENCHMARKS.md); a model that learnt flipped labels, a
broken output bias or a dense feature on another scale differs by more. It is judged
only on a candidate that waits (``history.py``): a version promoted at its push is never delayed for live
figures, and a candidate with fewer paired events than ``drift_min_events`` has no verdict.

Recovery (``decide``): after a hold, ``recovery_versions`` versions in a row must pass before the newest is
promoted (reason ``recovering`` until then). A model an incident damaged recovers gradually while the
trainer learns from the clean stream again; each version's figures are noisy, and one of them passing by
chance must not hand users a model that is still damaged. When no newer version comes (the stream paused),
serving's book (``history.py``) promotes a passing version that has stayed the newest for
``settle_s`` seconds though the count is short: the newest good model reaches users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Mapping

from streamrec.foundation.noise import auc_se, binomial_se, mean_se
from streamrec.snapshot.evidence import Evidence, Figures, InputHealth, read_evidence

from .drift import DriftFigures
from .golden import GoldenComparison

REASONS = ("dead_letters", "dense_zeros", "field_empty", "field_novel", "label_rate", "calibration", "logloss",
           "auc", "field_contribution", "golden", "drift", "recovering")


@dataclass
class Verdict:
    ok: bool
    reason: str = ""  # the first failing check (a label of streamrec_serving_versions_held_total), "" when ok
    detail: str = ""  # every failing check with its figures, one line

    @property
    def line(self) -> str:
        return self.detail or "passes"


@dataclass
class History:
    """EWMAs over promoted versions' evidence (None: no promoted version with evidence yet)."""

    logloss: float | None = None
    auc: float | None = None
    label_rate: float | None = None
    dense_zero: float | None = None
    dense_cols: list = field(default_factory=list)
    empty: dict = field(default_factory=dict)
    novel: dict = field(default_factory=dict)
    promoted: int = 0  # versions folded in since the last reset
    # the last judged windows' differences from the history (SPREAD_WINDOWS of them): how much a real stream's
    # windows differ beyond sampling (which users, which items a window holds)
    auc_devs: list = field(default_factory=list)
    logloss_devs: list = field(default_factory=list)
    contribution: dict = field(default_factory=dict)  # per field: its contribution to the ranking (EWMA)
    contribution_devs: dict = field(default_factory=dict)  # per field: the judged windows' differences
    contribution_low: dict = field(default_factory=dict)  # per field: its last judged window fell past z_two


def _ewma(old, new, w: float):
    if new is None:
        return old
    return float(new) if old is None else float((1 - w) * old + w * new)


SPREAD_WINDOWS = 30  # judged windows whose differences from the history give the spread
SPREAD_VERSIONS = 8  # windows the spread needs before the checks use it; before that, sampling error alone
SPREAD_CAP = 3.0  # the spread widens a check to at most this many times the window's sampling error
CONTRIBUTION_MIN_EVENTS = 200  # events a field's contribution needs to be judged (fewer: its SE is itself noise)


def _note(devs: list, value, base) -> None:
    """Keep ``value - base`` among the last ``SPREAD_WINDOWS`` differences."""
    if value is not None and base is not None:
        devs.append(float(value) - float(base))
        del devs[:-SPREAD_WINDOWS]


def _spread(devs: list) -> float:
    """A robust standard deviation of ``devs`` (1.4826 median absolute differences: an incident in fewer than
    half of the windows barely moves it); 0 until ``SPREAD_VERSIONS`` are known."""
    if len(devs) < SPREAD_VERSIONS:
        return 0.0
    d = sorted(abs(x) for x in devs)
    return 1.4826 * d[len(d) // 2]


DOWN_WEIGHT = 0.5  # an input share's history follows a fall this fast (a rise at history_weight)


def _share_ewma(old, new, w: float):
    """A "higher is worse" share's history: it falls quickly to a healthier level (the first versions of a
    fresh trainer see every id as new) and rises slowly, so a jump stands out against the healthy level."""
    if new is None or old is None:
        return _ewma(old, new, w)
    return _ewma(old, new, max(w, DOWN_WEIGHT) if new < old else w)


class Guard:
    """Judges evidence blocks against ``[serving.guard]`` and the history of promoted versions."""

    def __init__(self, gcfg):
        self.cfg = gcfg
        self.history = History()
        self.passing: int | None = None  # versions in a row that passed since the last hold (None: no hold)

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.enabled)

    def _figures(self, ev: Evidence) -> Figures | None:
        """The window the label and score checks read (see the module docstring), or None."""
        for w in (ev.since_previous, ev.recent):
            if w.events >= self.cfg.min_events:
                return w
        return None

    def judge(self, block: Mapping[str, Any] | None, golden: GoldenComparison | None = None) -> Verdict:
        """The verdict on a manifest's evidence block (``manifest.evidence``; None: the version carries none)
        and, when given, the candidate's comparison with the promoted version on the golden set."""
        if not self.enabled:
            return Verdict(True)
        ev = read_evidence(block)
        if ev is None:
            return Verdict(False, "no_evidence", "the version carries no quality evidence")
        fails = self._input_fails(ev.input) + self._score_fails(self._figures(ev)) + \
            self._contribution_fails(ev) + self._golden_fails(golden)
        if not fails:
            return Verdict(True)
        fails.sort(key=lambda f: REASONS.index(f[0]))
        return Verdict(False, fails[0][0], "; ".join(dict.fromkeys(d for _, d in fails)))

    def _input_fails(self, inp: InputHealth) -> list[tuple[str, str]]:
        """The input checks' failures: dead letters, dense zeros, empty and novel fields."""
        g, h = self.cfg, self.history
        fails: list[tuple[str, str]] = []
        if inp.records + inp.dead_letters and inp.dead_letter_share > g.dead_letter_share_max:
            fails.append(("dead_letters", f"dead-lettered share {inp.dead_letter_share:.3f} > "
                                          f"{g.dead_letter_share_max:g}"))
        if not inp.records:
            return fails
        if h.dense_zero is not None and inp.dense_zero_share - h.dense_zero > g.zero_share_jump:
            fails.append(("dense_zeros", f"all-zero dense vectors {inp.dense_zero_share:.3f}, history "
                                         f"{h.dense_zero:.3f}"))
        for i, x in enumerate(inp.dense_column_zero_share):
            base = h.dense_cols[i] if i < len(h.dense_cols) else None
            if base is not None and x - base > g.zero_share_jump:
                fails.append(("dense_zeros", f"dense[{i}] zero share {x:.3f}, history {base:.3f}"))
        for shares, hist, jump, what in ((inp.field_empty_share, h.empty, g.empty_share_jump, "field_empty"),
                                         (inp.field_novel_share, h.novel, g.novel_share_jump, "field_novel")):
            for name, x in shares.items():
                base = hist.get(name)
                if base is not None and x - base > jump:
                    noun = "events without ids" if what == "field_empty" else "unseen ids"
                    fails.append((what, f"field {name!r} {noun} {x:.3f}, history {base:.3f}"))
        return fails

    def _allowed(self, margin: float, se: float) -> float:
        """The difference a check holds beyond: its margin, or ``z`` standard errors when that is wider."""
        return max(margin, float(self.cfg.z) * se) if math.isfinite(se) else math.inf

    def _score_fails(self, w: Figures | None) -> list[tuple[str, str]]:
        """The label and score checks' failures on the window ``_figures`` chose (none without one)."""
        if w is None:
            return []
        g, h = self.cfg, self.history
        fails: list[tuple[str, str]] = []
        lr, mp, ll, n = w.label_rate, w.mean_prediction, w.logloss, w.events
        hist_noise = math.sqrt(2 / (2 - float(g.history_weight)))  # the history's own noise, see the docstring
        if lr is not None and h.label_rate is not None:
            se = binomial_se(h.label_rate, n) * hist_noise
            allowed = self._allowed(max(g.label_rate_tolerance * h.label_rate, g.label_rate_floor), se)
            if abs(lr - h.label_rate) > allowed:
                fails.append(("label_rate", f"label rate {lr:.3f}, history {h.label_rate:.3f} (+-{allowed:.3f})"))
        if lr and mp is not None:
            cal = mp / lr
            rel_se = binomial_se(lr, n) / lr
            if not g.calibration_min <= cal <= g.calibration_max and (cal <= 0 or abs(math.log(cal)) > g.z * rel_se):
                fails.append(("calibration", f"calibration {cal:.3f} outside [{g.calibration_min:g}, "
                                             f"{g.calibration_max:g}]"))
        if ll is not None and h.logloss is not None:
            se = mean_se(w.logloss_var, n) * hist_noise if w.logloss_var is not None else 0.0
            se = max(se, min(_spread(h.logloss_devs), SPREAD_CAP * se))
            allowed = self._allowed(h.logloss * g.logloss_margin, se)
            if ll - h.logloss > allowed:
                fails.append(("logloss", f"logloss {ll:.4f} > history {h.logloss:.4f} + {allowed:.4f} (margin "
                                         f"{g.logloss_margin:.0%}, {g.z:g} SE {g.z * se:.4f})"))
        if w.auc is not None and h.auc is not None:
            se = self._auc_se(w)
            allowed = self._allowed(g.auc_margin, se)
            if h.auc - w.auc > allowed:
                fails.append(("auc", f"AUC {w.auc:.4f} < history {h.auc:.4f} - {allowed:.4f} (margin "
                                     f"{g.auc_margin:g}, {g.z:g} SE {g.z * se:.4f})"))
        return fails

    def _auc_se(self, w: Figures) -> float:
        """The SE the ``auc`` check judges window ``w`` on: Hanley-McNeil's, widened by the spread (capped)."""
        h, counts = self.history, w.labelled
        se = auc_se(h.auc, *counts) * math.sqrt(2 / (2 - float(self.cfg.history_weight))) if counts else 0.0
        return max(se, min(_spread(h.auc_devs), SPREAD_CAP * se))

    def _auc_low(self, ev: Evidence, z: float) -> bool:
        """Whether the window's AUC is more than ``z`` of its SE below its history."""
        w = self._figures(ev)
        if w is None or w.auc is None or self.history.auc is None:
            return False
        se = self._auc_se(w)
        return math.isfinite(se) and self.history.auc - w.auc > z * se

    def _contribution_drops(self, ev: Evidence) -> dict[str, tuple[float, float, float, float]]:
        """Per judged field (see the module docstring): its drop below its history, the SE it is judged on,
        the z of one window alone and the z of two successive windows."""
        g, h = self.cfg, self.history
        hist_noise = math.sqrt(2 / (2 - float(g.history_weight)))
        judged = {name: c for name, c in ev.field_contribution.items()
                  if c.events >= CONTRIBUTION_MIN_EVENTS and h.contribution.get(name, -1.0) >= g.field_contribution_margin
                  and len(h.contribution_devs.get(name, ())) >= SPREAD_VERSIONS}
        if not judged:
            return {}
        tail = NormalDist().cdf(-float(g.z)) / len(judged)  # one test per field: Bonferroni
        z_one = -NormalDist().inv_cdf(tail) if g.z > 0 else 0.0
        z_two = -NormalDist().inv_cdf(math.sqrt(tail)) if g.z > 0 else 0.0  # both of two windows: the same tail
        out = {}
        for name, c in judged.items():
            se = c.se * hist_noise
            se = max(se, min(_spread(h.contribution_devs[name]), SPREAD_CAP * se))
            out[name] = (h.contribution[name] - c.contribution, se, z_one, z_two)
        return out

    def _contribution_fails(self, ev: Evidence) -> list[tuple[str, str]]:
        """The field contribution check's failures: a drop beyond ``max(margin, z_one * SE)``, or beyond
        ``max(margin, z_two * SE)`` in this window and the field's previous judged one."""
        g, h = self.cfg, self.history
        fails: list[tuple[str, str]] = []
        for name, (drop, se, z_one, z_two) in self._contribution_drops(ev).items():
            c, base = ev.field_contribution[name], h.contribution[name]
            for z, also in ((z_one, ""), (z_two, "the previous window too"), (z_two, "the window's AUC too")):
                allowed = max(g.field_contribution_margin, z * se)
                if drop > allowed and (not also or (h.contribution_low.get(name) if also.startswith("the previous")
                                                    else self._auc_low(ev, z_two))):
                    fails.append(("field_contribution", f"field {name!r} contribution {c.contribution:+.4f} < "
                                                        f"history {base:+.4f} - {allowed:.4f} ({c.events} events, "
                                                        f"{z:.2f} SE{', ' + also if also else ''})"))
                    break
        return fails

    def _golden_fails(self, c: GoldenComparison | None) -> list[tuple[str, str]]:
        """The golden set's check (see the module docstring); none without a comparison."""
        g = self.cfg
        if c is None or not g.golden_events:
            return []
        fails: list[tuple[str, str]] = []
        allowed = self._allowed(g.golden_auc_margin, c.auc_se)
        if -c.auc_delta > allowed:
            fails.append(("golden", f"golden-set AUC {c.auc:.4f} < promoted {c.auc_promoted:.4f} - {allowed:.4f} "
                                    f"({c.events} events)"))
        allowed = self._allowed(g.golden_logloss_margin * c.logloss_promoted, c.logloss_se)
        if c.logloss_delta > allowed:
            fails.append(("golden", f"golden-set logloss {c.logloss:.4f} > promoted {c.logloss_promoted:.4f} + "
                                    f"{allowed:.4f} ({c.events} events)"))
        return fails

    def judge_drift(self, d: DriftFigures | None) -> Verdict:
        """The live drift check on a waiting candidate's paired figures (see the module docstring); ok while
        they are too few to judge."""
        g = self.cfg
        if not self.enabled or not g.drift_max or d is None or d.events < g.drift_min_events:
            return Verdict(True)
        allowed = g.drift_max + float(g.z) * d.mean_abs_logit_se  # clearly beyond: its lower bound is past it
        if d.mean_abs_logit <= allowed:
            return Verdict(True)
        return Verdict(False, "drift", f"live drift: mean |log-odds difference| {d.mean_abs_logit:.3f} > "
                                       f"{allowed:.3f} against version {d.promoted} over {d.events} live events "
                                       f"(score ratio {d.score_ratio:.3f})")

    def decide(self, ev: Mapping[str, Any] | None, golden: GoldenComparison | None = None) -> Verdict:
        """``judge``, with recovery after a hold (see the module docstring): the verdict serving acts on. A
        version it holds has its window's differences kept for the spread (a promoted one's: ``promoted``)."""
        v = self._recovering(self.judge(ev, golden))
        held = read_evidence(ev) if not v.ok and ev is not None else None
        if held is not None:
            self._note_spread(held)
        return v

    def _recovering(self, v: Verdict) -> Verdict:
        if not v.ok:
            self.passing = 0
            return v
        if self.passing is None:
            return v
        self.passing += 1
        need = int(self.cfg.recovery_versions)
        if self.passing < need:
            return Verdict(False, "recovering", f"passes, {self.passing} of {need} versions in a row since the "
                                                "last hold")
        self.passing = None
        return v

    def _note_spread(self, ev: Evidence) -> None:
        h, w = self.history, self._figures(ev)
        if w is not None:
            _note(h.auc_devs, w.auc, h.auc)
            _note(h.logloss_devs, w.logloss, h.logloss)
        drops = self._contribution_drops(ev)
        for name, c in ev.field_contribution.items():
            if c.events >= CONTRIBUTION_MIN_EVENTS:
                drop, se, _, z_two = drops.get(name, (0.0, 0.0, 0.0, 0.0))
                h.contribution_low[name] = name in drops and drop > max(self.cfg.field_contribution_margin, z_two * se)
                _note(h.contribution_devs.setdefault(name, []), c.contribution, h.contribution.get(name))

    def promoted(self, block: Mapping[str, Any] | None) -> None:
        """Fold a promoted version's evidence block into the histories."""
        ev = read_evidence(block)
        if ev is None:
            return
        h, wt = self.history, (1.0 if self.history.promoted == 0 else float(self.cfg.history_weight))
        w = self._figures(ev)
        self._note_spread(ev)
        for name, c in ev.field_contribution.items():
            if c.events >= CONTRIBUTION_MIN_EVENTS:
                h.contribution[name] = _ewma(h.contribution.get(name), c.contribution, wt)
        if w is not None:
            h.logloss = _ewma(h.logloss, w.logloss, wt)
            h.auc = _ewma(h.auc, w.auc, wt)
            h.label_rate = _ewma(h.label_rate, w.label_rate, wt)
        inp = ev.input
        if inp.records:
            h.dense_zero = _share_ewma(h.dense_zero, inp.dense_zero_share, wt)
            h.dense_cols = [_share_ewma(h.dense_cols[i] if i < len(h.dense_cols) else None, x, wt)
                            for i, x in enumerate(inp.dense_column_zero_share)]
            for shares, hist in ((inp.field_empty_share, h.empty), (inp.field_novel_share, h.novel)):
                for name, x in shares.items():
                    hist[name] = _share_ewma(hist.get(name), x, wt)
        h.promoted += 1

    def reset(self, ev: Mapping[str, Any] | None) -> None:
        """Start the histories again from ``ev`` alone (an operator accepted a changed stream)."""
        self.history = History()
        self.passing = None
        self.promoted(ev)

    def state(self) -> dict[str, Any]:
        h = self.history
        return {"logloss": h.logloss, "auc": h.auc, "label_rate": h.label_rate, "dense_zero": h.dense_zero,
                "dense_cols": list(h.dense_cols), "empty": dict(h.empty), "novel": dict(h.novel),
                "promoted": h.promoted, "passing": self.passing, "auc_devs": list(h.auc_devs),
                "logloss_devs": list(h.logloss_devs), "contribution": dict(h.contribution),
                "contribution_devs": {k: list(v) for k, v in h.contribution_devs.items()},
                "contribution_low": dict(h.contribution_low)}

    def load_state(self, d: dict[str, Any]) -> None:
        try:
            self.history = History(d.get("logloss"), d.get("auc"), d.get("label_rate"), d.get("dense_zero"),
                                   list(d.get("dense_cols") or []), dict(d.get("empty") or {}),
                                   dict(d.get("novel") or {}), int(d.get("promoted", 0)),
                                   [float(x) for x in d.get("auc_devs") or []][-SPREAD_WINDOWS:],
                                   [float(x) for x in d.get("logloss_devs") or []][-SPREAD_WINDOWS:],
                                   {str(k): float(v) for k, v in (d.get("contribution") or {}).items()},
                                   {str(k): [float(x) for x in v][-SPREAD_WINDOWS:]
                                    for k, v in (d.get("contribution_devs") or {}).items()},
                                   {str(k): bool(v) for k, v in (d.get("contribution_low") or {}).items()})
            self.passing = None if d.get("passing") is None else int(d["passing"])
        except (TypeError, ValueError, AttributeError):
            self.history = History()
