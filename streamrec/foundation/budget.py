"""The device tier's size, from ``hot.budget_rows`` or ``hot.budget_bytes``.

One rule, because three processes must agree on it: the embedding store sizes its
device tier with it, the sketch worker chooses hot rows within it, and the trainer's
in-process hot source does the same. A hot row on the device costs its float32
vector plus its row-wise Adagrad accumulator (one float32), so with per-table widths
(``model.tables``) a row's cost depends on its table: a byte budget is spent row by
row at each row's own width (:meth:`HotBudget.fit`), and the row cap the store
allocates for is the most rows the bytes can buy (all of the narrowest table).
With one width for every table this is exactly ``budget_bytes // hot_row_bytes(dim)`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import numpy as np

    from streamrec.app.config import Config

FLOAT32_BYTES = 4


def hot_row_bytes(embedding_dim: int) -> int:
    """Device bytes of one hot row: ``embedding_dim`` float32 weights + one float32 Adagrad sum."""
    return FLOAT32_BYTES * (embedding_dim + 1)


@dataclass(frozen=True)
class HotBudget:
    """The device tier's budget: at most ``rows`` rows and, when ``bytes`` > 0, at most ``bytes``
    device bytes, a row of table ``t`` costing ``row_bytes[t]``."""

    rows: int
    bytes: int = 0
    row_bytes: Mapping[str, int] = field(default_factory=dict)

    def cost(self, counts: Mapping[str, int]) -> int:
        """Device bytes of ``counts[t]`` hot rows of each table ``t``."""
        return sum(int(n) * self.row_bytes[t] for t, n in counts.items())

    def fits(self, counts: Mapping[str, int]) -> bool:
        """Whether ``counts[t]`` hot rows of each table fit the rows and the bytes."""
        return sum(int(n) for n in counts.values()) <= self.rows and (self.bytes <= 0 or self.cost(counts) <= self.bytes)

    def fit(self, tables: "np.ndarray", names: list[str]) -> int:
        """How many leading candidates fit: ``tables[i]`` indexes ``names`` (the table of candidate ``i``,
        candidates hottest first). Rows are taken in order until the row cap or the bytes run out."""
        import numpy as np

        n = min(len(tables), self.rows)
        if self.bytes <= 0 or not n:
            return max(0, n)
        per = np.asarray([self.row_bytes[t] for t in names], dtype=np.int64)
        cost = np.cumsum(per[np.asarray(tables[:n], dtype=np.int64)])
        return int(np.searchsorted(cost, self.bytes, side="right"))


def hot_budget(cfg: "Config") -> HotBudget:
    """The device tier's budget for ``cfg``: per table, rows at the table's width (``cfg.model.tables``)."""
    widths = cfg.model.tables
    row_bytes = {t: hot_row_bytes(d) for t, d in widths.items()}
    if cfg.hot.budget_bytes > 0:
        return HotBudget(cfg.hot.budget_bytes // min(row_bytes.values(), default=hot_row_bytes(cfg.model.embedding_dim)),
                         int(cfg.hot.budget_bytes), row_bytes)
    return HotBudget(max(0, cfg.hot.budget_rows), 0, row_bytes)


def hot_budget_rows(cfg: "Config") -> int:
    """Rows the device tier holds at most: ``hot.budget_rows``, or with a byte budget the rows of the
    narrowest table it buys (``hot.budget_bytes // hot_row_bytes``)."""
    return hot_budget(cfg).rows
