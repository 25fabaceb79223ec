"""The values a snapshot's row settings and names may take (stdlib only: serving's config section
checks them, and the snapshot format writes them)."""

from __future__ import annotations

from typing import Literal

RowPrecision = Literal["fp32", "fp16", "int8"]
"""``serving.row_precision``: how embedding rows travel in snapshots and deltas and sit in serving's
memory: float32 as trained, float16, or int8 with a float16 scale and bias per row (FBGEMM's row-wise
quantization). Training state always stays float32."""

MODEL_LINE_RE = r"[a-z][a-z0-9_-]{0,31}"
"""A model line's name (a snapshot manifest's ``model_line``, ``serving.model_line``): lower-case letters,
digits, ``_`` and ``-``, at most 32 characters."""
