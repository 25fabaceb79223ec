"""The values the snapshot's row settings may take, as ``typing.Literal`` aliases (stdlib only: the
config imports this module)."""

from __future__ import annotations

from typing import Literal

RowPrecision = Literal["fp32", "fp16", "int8"]
"""``serving.row_precision``: how embedding rows travel in snapshots and deltas and sit in serving's
memory: float32 as trained, float16, or int8 with a float16 scale and bias per row (FBGEMM's row-wise
quantization). Training state always stays float32."""
