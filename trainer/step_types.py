"""The seam between a fused training step and whoever owns the embedding rows.

:class:`RowSource` is what :class:`~streamrec.trainer.fused_step.FusedStep` needs of a row
owner: device-resident rows it reads and updates itself (one arena per width), and the rest,
which it reads and hands gradients back to through the owner. ``EmbeddingStore`` is the
built-in source (hot rows resident, cold rows through its tiers); the in-memory baseline
(``reference.MemoryDLRM``) keeps every row resident.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class Arena(Protocol):
    """Resident rows of one width: ``w [rows + 1, dim]`` and their Adagrad sums ``acc [rows + 1]`` on the
    device; row ``scratch`` (the last) belongs to no id and takes fixed-shape steps' padded updates."""

    w: torch.Tensor
    acc: torch.Tensor

    @property
    def scratch(self) -> int: ...


@runtime_checkable
class RowSource(Protocol):
    """Embedding rows for a fused step (module doc). Row-wise Adagrad at ``lr``/``eps`` is the update rule
    of every row, resident or not (``streamrec.embedding_store.adagrad_rows``)."""

    lr: float
    eps: float

    def arena(self, dim: int) -> Arena:
        """The resident rows of width ``dim``."""
        ...

    def resolve(self, tables: Sequence[str], lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Each id's row in its table's width's arena, -1 where the row is not resident; ``ids`` are
        consecutive runs, ``lengths[k]`` ids of table ``tables[k]`` each."""
        ...

    def lookup(self, table: str, ids: np.ndarray, host: bool = False) -> torch.Tensor:
        """Rows ``[n, dim]`` of unique non-resident ``ids`` (on the host with ``host``)."""
        ...

    def peek(self, table: str, ids: np.ndarray, host: bool = False) -> torch.Tensor:
        """Like :meth:`lookup`, for scoring only: reads without changing any tier or count of the rows."""
        ...

    def prefetch(self, table: str, ids: np.ndarray) -> None:
        """Start reading the rows of unique non-resident ``ids`` for a later :meth:`lookup`."""
        ...

    def apply_gradients(self, table: str, ids: np.ndarray, grads: torch.Tensor) -> object:
        """Update the rows of unique non-resident ``ids`` (those :meth:`lookup` just read) with ``grads``."""
        ...

    def mark_hot_written(self, dim: int, arena_slots: np.ndarray) -> None:
        """The resident rows at ``arena_slots`` of the width-``dim`` arena were just updated there."""
        ...
