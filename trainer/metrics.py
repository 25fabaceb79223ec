"""Online metrics for progressive validation: every event is scored before it is
trained on, so these numbers measure generalisation, not fit.

Since-start AUC uses a fixed histogram of scores (bounded memory over an endless
stream, error ~1/bins); the sliding window keeps the last ``window`` (label, score)
pairs in a ring buffer and computes the exact AUC on demand.
"""

from __future__ import annotations

import math

import numpy as np

from streamrec.foundation import roc_auc

_EPS = 1e-7


def binned_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC from per-bin positive/negative counts (bins in increasing score order); ties within a bin count half."""
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    neg_below = np.cumsum(neg) - neg
    return float((pos * (neg_below + 0.5 * neg)).sum() / (n_pos * n_neg))


def logloss_sum(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(probs.astype(np.float64), _EPS, 1 - _EPS)
    y = labels.astype(np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).sum())


class StreamingMetrics:
    """AUC and logloss since start (binned) and over a sliding window (exact)."""

    def __init__(self, window: int = 20_000, bins: int = 10_000):
        self.bins = bins
        self.pos = np.zeros(bins, np.float64)
        self.neg = np.zeros(bins, np.float64)
        self.count = 0
        self.loss_total = 0.0
        self.window = max(1, window)
        self._wy = np.zeros(self.window, np.float32)
        self._wp = np.zeros(self.window, np.float32)
        self._wn = 0  # valid entries in the ring
        self._wi = 0  # next write position

    def update(self, labels: np.ndarray, probs: np.ndarray) -> None:
        labels = np.asarray(labels, np.float32).reshape(-1)
        probs = np.asarray(probs, np.float32).reshape(-1)
        if len(labels) == 0:
            return
        b = np.clip((probs * self.bins).astype(np.int64), 0, self.bins - 1)
        self.pos += np.bincount(b, weights=labels, minlength=self.bins)
        self.neg += np.bincount(b, weights=1.0 - labels, minlength=self.bins)
        self.count += len(labels)
        self.loss_total += logloss_sum(labels, probs)
        # ring buffer write (keep only the tail if the update is larger than the window)
        if len(labels) >= self.window:
            self._wy[:] = labels[-self.window:]
            self._wp[:] = probs[-self.window:]
            self._wi, self._wn = 0, self.window
            return
        n = len(labels)
        end = self._wi + n
        if end <= self.window:
            self._wy[self._wi:end] = labels
            self._wp[self._wi:end] = probs
        else:
            k = self.window - self._wi
            self._wy[self._wi:] = labels[:k]
            self._wp[self._wi:] = probs[:k]
            self._wy[: n - k] = labels[k:]
            self._wp[: n - k] = probs[k:]
        self._wi = end % self.window
        self._wn = min(self.window, self._wn + n)

    @property
    def auc(self) -> float:
        return binned_auc(self.pos, self.neg)

    @property
    def logloss(self) -> float:
        return self.loss_total / self.count if self.count else float("nan")

    def window_auc(self) -> float:
        if self._wn == 0:
            return float("nan")
        return roc_auc(self._wy[: self._wn], self._wp[: self._wn])

    def window_logloss(self) -> float:
        if self._wn == 0:
            return float("nan")
        return logloss_sum(self._wy[: self._wn], self._wp[: self._wn]) / self._wn

    def newest(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The labels and scores of the window's newest ``n`` events (fewer when it holds fewer), oldest first."""
        n = min(int(n), self._wn)
        at = (self._wi - np.arange(n, 0, -1)) % self.window  # ring positions, oldest first
        return self._wy[at], self._wp[at]

    def state(self) -> dict:
        """Everything needed to continue after a restart (goes into the checkpoint)."""
        return {"pos": self.pos.tolist(), "neg": self.neg.tolist(), "count": self.count,
                "loss_total": self.loss_total}

    def load_state(self, st: dict) -> None:
        if len(st.get("pos", [])) == self.bins:
            self.pos = np.asarray(st["pos"], np.float64)
            self.neg = np.asarray(st["neg"], np.float64)
        self.count = int(st.get("count", 0))
        self.loss_total = float(st.get("loss_total", 0.0))


def finite(x: float) -> float | None:
    """JSON has no NaN: map non-finite numbers to null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
