"""DLRM (Naumov et al. 2019): bottom MLP over dense features, one pooled embedding per
sparse field, pairwise dot interaction, top MLP.

The module holds only the dense parameters. Embedding rows live in the tiered
store and arrive here already looked up and pooled, ``[batch, pooled_dim]`` (every
field's pooled vector, concatenated in field order), so the same module scores for
the trainer and for serving. The pairwise interaction needs one width: a field whose
dim differs from ``model.embedding_dim`` is projected to it by its own learned linear
map (mixed-dimension embeddings); fields at that width have none, so a model whose
fields all share it has exactly the parameters it always had.

This module also holds the batch-to-tensor glue every model shares: per-table unique
ids (:func:`unique_ids`), the lookup and sum-pooling (:func:`embed_batch`), scoring
(:func:`predict_batch`) and :func:`task_logits`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    import numpy as np


def mlp(sizes: list[int], last_activation: bool, tasks: int = 0, seed: int = 0) -> nn.Sequential:
    """A ReLU MLP of ``sizes``; ``tasks`` > 0: its last layer is a :func:`task_head` of ``tasks`` outputs
    (``sizes[-1]`` must be 1 then)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        if last and tasks:
            if sizes[-1] != 1:
                raise ValueError(f"an MLP with a task head ends in 1 unit per task, got {sizes[-1]}")
            layers.append(task_head(sizes[i], tasks, seed))
        else:
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if not last or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def task_head(in_features: int, num_tasks: int, seed: int = 0, bias: bool = True) -> nn.Linear:
    """A linear layer with one output per task whose first task's weights (and bias) take exactly the draws a
    one-output layer takes from torch's global generator; the other tasks' come from a generator of their own
    (seeded from ``seed``). So adding tasks changes neither the first task's starting point nor any layer made
    after the head: a model of several tasks starts where the one-task model does."""
    first = nn.Linear(in_features, 1, bias=bias)
    if num_tasks == 1:
        return first
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1_000_003 + 7919)
        head = nn.Linear(in_features, num_tasks, bias=bias)
    with torch.no_grad():
        head.weight[0].copy_(first.weight[0])
        if bias:
            head.bias[0].copy_(first.bias[0])
    return head


class DLRM(nn.Module):
    def __init__(self, num_fields: int, dense_dim: int, embedding_dim: int,
                 bottom_mlp: list[int], top_mlp: list[int], seed: int = 0,
                 field_dims: Sequence[int] | None = None, num_tasks: int = 1):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.dense_dim = dense_dim
            self.num_fields = num_fields
            self.embedding_dim = embedding_dim
            self.field_dims = [int(d) for d in field_dims] if field_dims is not None else [embedding_dim] * num_fields
            if len(self.field_dims) != num_fields:
                raise ValueError(f"{len(self.field_dims)} field dims for {num_fields} fields")
            self.bottom = mlp([dense_dim, *bottom_mlp], last_activation=True) if dense_dim else None
            n = num_fields + (1 if self.bottom is not None else 0)
            # the pairs (i > j) of the interaction, made on the CPU (on the meta device, where serving counts a
            # model's parameters, tril_indices runs a slow Python decomposition, once per process) and
            # placed where the model is built
            tri = torch.tril_indices(n, n, offset=-1, device="cpu")
            # as one flat index into the row-major [n, n] interaction matrix: one index_select,
            # cheaper than advanced indexing with two index tensors
            self.register_buffer("_pairs", (tri[0] * n + tri[1]).to(torch.empty(0).device), persistent=False)
            top_in = n * (n - 1) // 2 + (embedding_dim if self.bottom is not None else 0)
            self.top = mlp([top_in, *top_mlp, 1], last_activation=False, tasks=num_tasks, seed=seed)
            # made after every other layer, so the other layers' initial weights do not depend on the field dims
            self.project = field_projections(self.field_dims, embedding_dim)

    @classmethod
    def from_config(cls, model_cfg) -> "DLRM":
        return cls(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim,
                   list(model_cfg.bottom_mlp), list(model_cfg.top_mlp), model_cfg.seed,
                   field_dims=list(model_cfg.field_dims.values()), num_tasks=len(model_cfg.tasks))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, tasks]`` from dense ``[batch, dense_dim]`` and pooled ``[batch, pooled_dim]``."""
        emb = field_matrix(pooled, self.field_dims, self.embedding_dim, self.project)
        if self.bottom is not None:
            x = self.bottom(dense)
            feats = torch.cat([x.unsqueeze(1), emb], dim=1)
        else:
            x = None
            feats = emb
        inter = torch.bmm(feats, feats.transpose(1, 2))
        flat = inter.flatten(1).index_select(1, self._pairs)  # == inter[:, tri[0], tri[1]], same values and gradient
        z = torch.cat([x, flat], dim=1) if x is not None else flat
        return self.top(z)


def field_projections(field_dims: Sequence[int], width: int) -> nn.ModuleDict | None:
    """A bias-free ``nn.Linear(dim, width)`` per field whose dim is not ``width`` (keyed by field position);
    None when every field already has that width (the module then has no extra parameters)."""
    proj = {str(i): nn.Linear(d, width, bias=False) for i, d in enumerate(field_dims) if d != width}
    return nn.ModuleDict(proj) if proj else None


def field_matrix(pooled: torch.Tensor, field_dims: Sequence[int], width: int,
                 project: nn.ModuleDict | None) -> torch.Tensor:
    """``[batch, fields, width]`` from the flat ``pooled [batch, sum(field_dims)]``: a view when every field
    has ``width`` columns, else each field's slice, projected when its dim differs."""
    if project is None:
        return pooled.view(pooled.shape[0], len(field_dims), width)
    parts, at = [], 0
    for i, d in enumerate(field_dims):
        v = pooled[:, at:at + d]
        at += d
        parts.append(project[str(i)](v) if str(i) in project else v)
    return torch.stack(parts, dim=1)


def task_logits(out: torch.Tensor, num_tasks: int) -> torch.Tensor:
    """A model's output as ``[batch, num_tasks]``: a ``[batch]`` output is accepted when there is one task
    (made ``[batch, 1]``); any other shape is a ``ValueError`` of one line."""
    if out.dim() == 2 and out.shape[1] == num_tasks:
        return out
    if out.dim() == 1 and num_tasks == 1:
        return out.unsqueeze(1)
    want = "[batch, 1] or [batch]" if num_tasks == 1 else f"[batch, {num_tasks}]"
    raise ValueError(f"the model returned logits of shape {tuple(out.shape)}, expected {want} "
                     f"(one logit per task, {num_tasks} task{'s' if num_tasks != 1 else ''})")


class _PoolSum(torch.autograd.Function):
    """Sum pooling whose backward adds each row's gradient over its occurrences in ``index`` order.

    ``embedding_bag``'s own backward sorts the indices first, so the order in which a row's
    occurrences are added (and with it the last bits of the row's gradient) depends on every other
    index in the call: pooling all fields in one call would not give the rows that one call per
    field gives. ``index_add_`` in occurrence order does, on a CPU; CUDA adds atomically, in no
    fixed order, as every CUDA sum of scattered values does."""

    @staticmethod
    def forward(ctx, rows, index, offsets):
        ctx.save_for_backward(index, offsets)
        ctx.n_rows = rows.shape[0]
        return F.embedding_bag(index, rows, offsets[:-1], mode="sum", include_last_offset=False)

    @staticmethod
    def backward(ctx, grad):
        index, offsets = ctx.saved_tensors
        per = torch.repeat_interleave(grad, offsets[1:] - offsets[:-1], dim=0, output_size=index.numel())
        rows = torch.zeros((ctx.n_rows, grad.shape[1]), dtype=grad.dtype, device=grad.device)
        return rows.index_add_(0, index, per), None, None


def pool_sum(rows: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum-pool jagged lookups: bag ``i`` sums ``rows[index[offsets[i]:offsets[i+1]]]``.

    ``rows`` are unique rows (a leaf that collects their gradient), ``index`` maps every id occurrence
    to its row. Empty bags pool to zero. A row's gradient adds its occurrences in ``index`` order
    (on a CPU), so pooling several fields in one call gives each row of a table that only one of
    them uses the gradient one call per field gives, bit for bit.
    """
    if not rows.requires_grad:
        return F.embedding_bag(index, rows, offsets[:-1], mode="sum", include_last_offset=False)
    return _PoolSum.apply(rows, index, offsets)


def field_tables(fields) -> dict[str, str]:
    """``{field: table}`` in field order from what the batch glue accepts as ``fields``: a model config
    (its ``field_tables``), a mapping ``{field: table}``, or field names (each its own table)."""
    ft = getattr(fields, "field_tables", None)
    if ft is not None:
        return dict(ft)
    if isinstance(fields, Mapping):
        return {str(f): str(t) for f, t in fields.items()}
    return {str(f): str(f) for f in fields}


def table_fields(fields) -> dict[str, list[str]]:
    """``{table: [its fields, in field order]}``, tables in order of first use."""
    out: dict[str, list[str]] = {}
    for f, t in field_tables(fields).items():
        out.setdefault(t, []).append(f)
    return out


def unique_ids(batch, fields) -> dict:
    """Per TABLE ``(sorted unique ids, inverse index)`` of a batch: computed once per mini-batch and shared
    by the prefetch and the lookup (``embed_batch(uniques=...)``). A table shared by several fields has
    one unique set over all of them; its inverse index covers their ids concatenated in field order.
    ``fields``: as :func:`field_tables` takes it."""
    import numpy as np

    out = {}
    for t, fs in table_fields(fields).items():
        values = batch.sparse[fs[0]].values if len(fs) == 1 else np.concatenate([batch.sparse[f].values for f in fs])
        uniq, inverse = np.unique(values, return_inverse=True)
        out[t] = (uniq, inverse.reshape(-1))
    return out


def embed_batch(batch, fields, lookup, device, requires_grad: bool = False, uniques=None):
    """Look up and sum-pool every sparse field of an ``streamrec.foundation.EventBatch``.

    ``fields``: a model config, ``{field: table}`` or field names (each its own table). ``lookup(table,
    unique_ids: np.ndarray[int64]) -> Tensor[n, dim]`` fetches a table's rows (from the tiered store in
    training, from serving's copy in serving), once per table and step. Returns ``pooled [B, pooled_dim]``
    (every field's pooled vector, concatenated in field order) and, per table, ``(table, unique_ids, rows)``
    where ``rows`` is a leaf tensor whose ``.grad`` after backward is the gradient of each unique row,
    summed over every field that shares the table. ``uniques``: this batch's ``unique_ids(batch, fields)``
    when the caller has them.
    """
    import numpy as np

    pooled: dict[str, torch.Tensor] = {}
    touched = []
    order = list(field_tables(fields))
    for t, fs in table_fields(fields).items():
        if uniques is not None:
            uniq, inverse = uniques[t]
        elif len(fs) == 1:
            uniq, inverse = np.unique(batch.sparse[fs[0]].values, return_inverse=True)
        else:
            uniq, inverse = np.unique(np.concatenate([batch.sparse[f].values for f in fs]), return_inverse=True)
        rows = lookup(t, uniq).to(device)
        if requires_grad:
            rows = rows.detach().requires_grad_(True)
        index = torch.from_numpy(inverse.astype(np.int64, copy=False).reshape(-1)).to(device)
        at = 0
        for f in fs:
            j = batch.sparse[f]
            n = len(j.values)
            idx = index if len(fs) == 1 else index[at:at + n]
            at += n
            pooled[f] = pool_sum(rows, idx, torch.from_numpy(j.offsets).to(device))
        touched.append((t, uniq, rows))
    if not order:
        return torch.zeros((len(batch), 0), device=device), touched
    return torch.cat([pooled[f] for f in order], dim=1), touched


@torch.no_grad()
def predict_batch(model, batch, fields, lookup, device, num_tasks: int | None = None) -> "np.ndarray":
    """Probabilities ``[B, tasks]`` (float32) for a batch: the one scoring path shared by trainer and serving.
    ``num_tasks``: the model's task count (taken from ``fields`` when it is a model config; else 1 for a
    ``[B]`` output and the output's width otherwise)."""
    pooled, _ = embed_batch(batch, fields, lookup, device)
    dense = torch.from_numpy(batch.dense).to(device)
    out = model(dense, pooled)
    if num_tasks is None:
        tasks = getattr(fields, "tasks", None)
        num_tasks = len(tasks) if tasks is not None else (1 if out.dim() == 1 else int(out.shape[-1]))
    return torch.sigmoid(task_logits(out, num_tasks)).float().cpu().numpy()
