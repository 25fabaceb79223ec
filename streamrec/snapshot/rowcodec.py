"""Embedding rows in a snapshot's row precision (``serving.row_precision``): encode, decode, round trip.

- ``fp32``: the rows as trained, ``{"vector": float32[n, d]}``.
- ``fp16``: ``{"vector": float16[n, d]}`` (IEEE half precision, round to nearest).
- ``int8``: FBGEMM-style row-wise quantization, ``{"vector": uint8[n, d], "scale": float16[n],
  "bias": float16[n]}``. Per row ``bias = min`` and ``scale = (max - min) / 255``, both rounded to
  float16 first; the row is then quantized with those rounded values,
  ``q = clip(round((x - bias) / scale), 0, 255)``, so decoding gives exactly what the encoder meant.
  A constant row (``max == min``) has scale 0 and ``q = 0``: it decodes to ``bias``.
  Decode: ``q * scale + bias`` in float32.

Error bound (int8), per element: ``|x - decode(encode(x))| <= scale / 2 + |min - bias| + 255 * |(max - min) / 255
- scale|``, where ``scale`` and ``bias`` are the stored float16 values: half a quantization step, plus the
float16 rounding of the row's minimum and of its step (each at most 2^-11 relative in float16's normal
range; the clip to 0..255 turns them into error at the row's ends, never into a wrap-around). fp16: the
float16 rounding of each element. Values beyond float16's range (|x| > 65504) cannot be held in either
and are refused. Everything is vectorised numpy and deterministic: the same rows always give the same bytes.

``round_trip(x, precision)`` is ``decode_rows(encode_rows(x, precision), precision)``: the values serving
scores with, and the values the trainer's row probe scores.
"""

from __future__ import annotations

import typing

import numpy as np

from .errors import SnapshotError
from .snapshot_types import RowPrecision

PRECISIONS: tuple[str, ...] = typing.get_args(RowPrecision)
FP16_MAX = float(np.finfo(np.float16).max)


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise SnapshotError(f"row precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def encode_rows(vectors: np.ndarray, precision: str) -> dict[str, np.ndarray]:
    """``vectors`` float32 ``[n, d]`` in ``precision``: ``{"vector": ...}`` plus, for int8, ``"scale"`` and
    ``"bias"`` (float16 ``[n]``)."""
    check_precision(precision)
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2:
        raise SnapshotError(f"rows to encode must be [n, d], got shape {tuple(x.shape)}")
    if precision == "fp32":
        return {"vector": x}
    big = ~(np.abs(x) <= FP16_MAX)
    if big.any():
        i = int(np.argmax(big.any(axis=1)))
        raise SnapshotError(f"row {i} holds a value beyond float16's range (|x| > {FP16_MAX:g}, or not finite): "
                            f"it cannot be sent as {precision}")
    if precision == "fp16":
        return {"vector": x.astype(np.float16)}
    n, d = x.shape
    if d == 0:
        return {"vector": np.zeros((n, 0), np.uint8), "scale": np.zeros(n, np.float16),
                "bias": np.zeros(n, np.float16)}
    lo = x.min(axis=1)
    hi = x.max(axis=1)
    bias = lo.astype(np.float16)
    with np.errstate(over="ignore"):
        scale = ((hi.astype(np.float64) - lo.astype(np.float64)) / 255.0).astype(np.float16)
    b32 = bias.astype(np.float32)[:, None]
    s32 = scale.astype(np.float32)[:, None]
    safe = np.where(s32 > 0, s32, np.float32(1.0))
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint((x - b32) / safe)
    q = np.where(s32 > 0, q, 0.0)
    q = np.clip(np.nan_to_num(q, nan=0.0), 0, 255).astype(np.uint8)
    return {"vector": q, "scale": scale, "bias": bias}


def decode_rows(encoded: dict[str, np.ndarray], precision: str) -> np.ndarray:
    """The float32 ``[n, d]`` rows that ``encoded`` (``encode_rows``'s output) stands for."""
    check_precision(precision)
    v = np.asarray(encoded["vector"])
    if precision != "int8":
        return np.ascontiguousarray(v, dtype=np.float32)
    scale = np.asarray(encoded["scale"]).astype(np.float32)[:, None]
    bias = np.asarray(encoded["bias"]).astype(np.float32)[:, None]
    return np.ascontiguousarray(v.astype(np.float32) * scale + bias, dtype=np.float32)


def round_trip(vectors: np.ndarray, precision: str) -> np.ndarray:
    """``decode_rows(encode_rows(vectors, precision), precision)``: the values serving holds for ``vectors``."""
    return decode_rows(encode_rows(vectors, precision), precision)
