"""The sampling error of quality figures: the trainer's evidence measures with it, serving's promotion guard
scales its margins by it.

A window of a few thousand events measures AUC, logloss and label rate with an error of the same order as
the guard's margins; these are the standard errors the guard scales its margins by:

- :func:`auc_se`: Hanley and McNeil's standard error of an AUC from the window's positive and negative counts;
- :func:`mean_se`: the standard error of a mean (a logloss) from its per-event variance;
- :func:`binomial_se`: a label rate's binomial standard error;
- :func:`paired_auc`: two models' AUCs on the same events and the standard error of their difference
  (DeLong's method: the two AUCs are correlated, so the difference's error is far smaller than either's).
"""

from __future__ import annotations

import math

import numpy as np


def auc_se(auc: float, positives: int, negatives: int) -> float:
    """Hanley-McNeil standard error of ``auc`` measured on ``positives`` and ``negatives`` events (inf when
    either is 0: such a window says nothing about ranking)."""
    if positives <= 0 or negatives <= 0:
        return math.inf
    a = min(max(float(auc), 0.0), 1.0)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)) / (positives * negatives)
    return math.sqrt(max(var, 0.0))


def mean_se(variance: float, n: int) -> float:
    """The standard error of a mean of ``n`` values of ``variance`` (inf for no values)."""
    return math.sqrt(max(float(variance), 0.0) / n) if n > 0 else math.inf


def binomial_se(rate: float, n: int) -> float:
    """The standard error of a rate ``rate`` measured on ``n`` events (inf for no events)."""
    p = min(max(float(rate), 0.0), 1.0)
    return math.sqrt(p * (1 - p) / n) if n > 0 else math.inf


def _midrank(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, ties given their mean rank."""
    order = np.argsort(x, kind="mergesort")
    _, inverse, counts = np.unique(x[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = np.empty(len(x))
    ranks[order] = ((ends - counts + 1 + ends) / 2.0)[inverse]
    return ranks


def _placements(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's placement values: per positive, the share of negatives scored below it (ties half); per
    negative, the share of positives scored above it."""
    pos, neg = scores[positive], scores[~positive]
    m, n = len(pos), len(neg)
    ranks = _midrank(np.concatenate([pos, neg]))
    v10 = (ranks[:m] - _midrank(pos)) / n
    v01 = 1.0 - (ranks[m:] - _midrank(neg)) / m
    return v10, v01


def paired_auc(labels: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float, float] | None:
    """(AUC of ``a``, AUC of ``b``, standard error of AUC(a) - AUC(b)) on the same labelled events, or None
    when one class has fewer than two events."""
    positive = np.asarray(labels) > 0.5
    m, n = int(positive.sum()), int((~positive).sum())
    if m < 2 or n < 2:
        return None
    a10, a01 = _placements(np.asarray(a, np.float64), positive)
    b10, b01 = _placements(np.asarray(b, np.float64), positive)
    var = np.var(a10 - b10, ddof=1) / m + np.var(a01 - b01, ddof=1) / n
    return float(a10.mean()), float(b10.mean()), math.sqrt(max(float(var), 0.0))
