"""The device tier's size in rows, from ``hot.budget_rows`` or ``hot.budget_bytes``.

One function, because three processes must agree on it: the embedding store
sizes its device tier with it, the sketch worker chooses that many rows, and the
trainer's in-process hot source does the same. A hot row on the device costs its
float32 vector plus its row-wise Adagrad accumulator (one float32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config

FLOAT32_BYTES = 4


def hot_row_bytes(embedding_dim: int) -> int:
    """Device bytes of one hot row: ``embedding_dim`` float32 weights + one float32 Adagrad sum."""
    return FLOAT32_BYTES * (embedding_dim + 1)


def hot_budget_rows(cfg: "Config") -> int:
    """Rows the device tier holds: ``hot.budget_bytes // hot_row_bytes`` when a byte budget is set,
    else ``hot.budget_rows``."""
    if cfg.hot.budget_bytes > 0:
        return cfg.hot.budget_bytes // hot_row_bytes(cfg.model.embedding_dim)
    return max(0, cfg.hot.budget_rows)
