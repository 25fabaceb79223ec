"""Count-min sketch over uint64 keys, vectorised, with conservative update.

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
from dataclasses import dataclass

import numpy as np

from .keys import splitmix64

_MAGIC = b"SRCM1"


@dataclass
class Aggregated:
    """A batch of keys with duplicates summed: what every vectorised update needs first."""

    keys: np.ndarray  # uint64 [U], sorted, unique
    weights: np.ndarray  # float64 [U]
    first: np.ndarray  # int64 [U]: position of one occurrence in the input (to carry ids along)


def aggregate(keys: np.ndarray, weights: np.ndarray | None = None) -> Aggregated:
    """Sum the weights of equal keys (one sort; no Python loop).

    Fast path: sort ``(key with its low bits replaced by the position)`` as plain
    uint64 -- a value sort is several times faster than ``argsort`` -- then read
    the positions back. Equal keys land next to each other; two different keys
    that share every high bit could interleave, which is detected and redone
    with ``argsort`` (exact either way).
    """
    keys = np.asarray(keys, dtype=np.uint64)
    n = len(keys)
    if n == 0:
        return Aggregated(np.zeros(0, np.uint64), np.zeros(0, np.float64), np.zeros(0, np.int64))
    bits = max(1, (n - 1).bit_length())
    if bits <= 24:
        low = np.uint64((1 << bits) - 1)
        packed = np.sort((keys & ~low) | np.arange(n, dtype=np.uint64))
        order = (packed & low).astype(np.intp)
        sk = keys[order]
        flag = np.empty(n, dtype=bool)
        flag[0] = True
        np.not_equal(sk[1:], sk[:-1], out=flag[1:])
        hi = packed & ~low
        if np.any(flag[1:] & (hi[1:] == hi[:-1])):  # high bits shared by different keys: be exact
            order = np.argsort(keys)
            sk = keys[order]
            np.not_equal(sk[1:], sk[:-1], out=flag[1:])
    else:
        order = np.argsort(keys)
        sk = keys[order]
        flag = np.empty(n, dtype=bool)
        flag[0] = True
        np.not_equal(sk[1:], sk[:-1], out=flag[1:])
    starts = np.flatnonzero(flag)
    if weights is None:
        w = np.diff(np.append(starts, n)).astype(np.float64)
    else:
        w = np.add.reduceat(np.asarray(weights, dtype=np.float64)[order], starts)
    return Aggregated(sk[starts], w, order[starts])


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
        self._mask = np.uint64(self.width - 1)
        self._salt = splitmix64(np.array([self.seed], dtype=np.uint64))[0]
        self._row_base = (np.arange(self.depth, dtype=np.uint64) * np.uint64(self.width))[:, None]
        self._row_mul = np.arange(self.depth, dtype=np.uint64)[:, None]

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

    def _cells(self, keys: np.ndarray) -> np.ndarray:
        """Flat indices [depth, n] of each key's cell in every row."""
        with np.errstate(over="ignore"):
            h1 = splitmix64(keys ^ self._salt)
            h2 = splitmix64(h1) | np.uint64(1)
            return (((h1[None, :] + self._row_mul * h2[None, :]) & self._mask) + self._row_base).astype(np.intp)

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.uint64)
        if len(keys) == 0:
            return np.zeros(0, np.float64)
        return self.counts.reshape(-1)[self._cells(keys)].min(axis=0)

    def add_unique(self, keys: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Add weights for *distinct* keys; returns their estimates after the update."""
        if len(keys) == 0:
            return np.zeros(0, np.float64)
        flat = self.counts.reshape(-1)
        cells = self._cells(keys)
        self.total += float(weights.sum())
        if self.conservative:
            new = flat[cells].min(axis=0) + weights
            # distinct keys may share a cell: the largest target wins, as a sequential update would
            np.maximum.at(flat, cells.reshape(-1), np.broadcast_to(new, cells.shape).reshape(-1))
            return new
        np.add.at(flat, cells.reshape(-1), np.broadcast_to(weights, cells.shape).reshape(-1))
        return flat[cells].min(axis=0)

    def add(self, keys: np.ndarray, weights: np.ndarray | None = None) -> Aggregated:
        """Add keys (duplicates allowed; each counts ``weights[i]`` or 1)."""
        agg = aggregate(keys, weights)
        self.add_unique(agg.keys, agg.weights)
        return agg

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
