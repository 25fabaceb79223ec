"""Count-min sketch over uint64 keys with conservative update; per-key loops compiled (``kernels.py``).

Width ``ceil(e / epsilon)`` (rounded up to a power of two so a row index is a
mask) and depth ``ceil(ln(1 / delta))`` give the classic guarantee: an estimate
is never below the true count and exceeds it by more than ``epsilon * total``
with probability at most ``delta``. Conservative update (raise each of a key's
cells only up to ``min + weight``) keeps that guarantee and cuts the
over-estimate of cold keys a lot on skewed streams. Counts are float64 so the
popularity sketch can add time-decay weights (see ``popularity.py``).

Row hashes use double hashing (``h1 + r * h2``), which preserves the count-min
bound (Kirsch & Mitzenmacher) and costs two splitmix64 passes for any depth.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from .kernels import Accumulator, cms_apply, cms_estimate, warm
from streamrec.foundation import splitmix64

_MAGIC = b"SRCM1"


class CountMinSketch:
    """A ``depth x width`` count-min sketch; ``merge`` of equal shapes is exact for plain updates."""

    def __init__(self, width: int, depth: int, seed: int = 0, conservative: bool = True):
        if width < 1 or width & (width - 1):
            raise ValueError(f"width must be a power of two >= 1, got {width}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.width = int(width)
        self.depth = int(depth)
        self.seed = int(seed)
        self.conservative = bool(conservative)
        self.counts = np.zeros((self.depth, self.width), dtype=np.float64)
        self.total = 0.0  # sum of every weight added (the N of the error bound)
        self._salt = splitmix64(np.array([self.seed], dtype=np.uint64))[0]
        warm()

    @classmethod
    def from_error(cls, epsilon: float, delta: float, seed: int = 0, conservative: bool = True) -> "CountMinSketch":
        if not 0 < epsilon < 1 or not 0 < delta < 1:
            raise ValueError(f"epsilon and delta must be in (0, 1), got {epsilon}, {delta}")
        width = 1 << max(0, math.ceil(math.log2(math.e / epsilon)))
        depth = max(1, math.ceil(math.log(1.0 / delta)))
        return cls(width, depth, seed, conservative)

    @property
    def epsilon(self) -> float:
        """The additive error bound as a fraction of ``total`` that this width gives."""
        return math.e / self.width

    @property
    def delta(self) -> float:
        return math.exp(-self.depth)

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(len(keys), np.float64)
        if len(keys):
            cms_estimate(self.counts, self._salt, keys, out)
        return out

    def apply(self, acc: Accumulator) -> np.ndarray:
        """Add the accumulator's distinct keys with their summed weights (emptying it); their estimates after."""
        est, total = cms_apply(self.counts, self._salt, self.conservative, acc)
        self.total += total
        return est

    def add(self, keys: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add keys (duplicates allowed; each counts ``weights[i]`` or 1)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64).view(np.int64)
        n = len(keys)
        w = np.ones(n, np.float64) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        if len(w) != n:
            raise ValueError(f"{n} keys but {len(w)} weights")
        if n and not np.all(w >= 0):  # also rejects NaN
            raise ValueError("count-min weights must be >= 0 (and not NaN)")
        offsets = np.arange(n + 1, dtype=np.int64)
        acc = Accumulator(min(max(n, 16), 1 << 16))
        at = 0
        while at < n:
            at = acc.add(0, np.uint64(0), False, keys, offsets, w, at)
            self.apply(acc)

    def scale(self, factor: float) -> None:
        self.counts *= factor
        self.total *= factor

    def compatible(self, other: "CountMinSketch") -> bool:
        return (self.width, self.depth, self.seed, self.conservative) == (
            other.width, other.depth, other.seed, other.conservative)

    def merge(self, other: "CountMinSketch") -> None:
        """Add another sketch of the same shape and seed (cell-wise sum)."""
        if not self.compatible(other):
            raise ValueError(
                f"cannot merge sketches of different shape: {self.depth}x{self.width} seed {self.seed} "
                f"vs {other.depth}x{other.width} seed {other.seed}")
        self.counts += other.counts
        self.total += other.total

    def copy(self) -> "CountMinSketch":
        c = CountMinSketch(self.width, self.depth, self.seed, self.conservative)
        c.counts[:] = self.counts
        c.total = self.total
        return c

    def to_bytes(self) -> bytes:
        head = struct.pack("<5sIIqBd", _MAGIC, self.width, self.depth, self.seed, self.conservative, self.total)
        return head + self.counts.tobytes()

    @classmethod
    def from_bytes(cls, b: bytes | memoryview) -> "CountMinSketch":
        size = struct.calcsize("<5sIIqBd")
        if len(b) < size or bytes(b[:5]) != _MAGIC:
            raise ValueError("not a serialised CountMinSketch (bad magic)")
        _, width, depth, seed, cons, total = struct.unpack("<5sIIqBd", bytes(b[:size]))
        body = b[size:]
        if len(body) != width * depth * 8:
            raise ValueError(f"CountMinSketch body has {len(body)} bytes, expected {width * depth * 8}")
        c = cls(width, depth, seed, bool(cons))
        c.counts[:] = np.frombuffer(body, dtype=np.float64).reshape(depth, width)
        c.total = total
        return c
