"""One training step for every table at once: the host prepares, the device computes.

A mini-batch's ids of every field travel as one :class:`~streamrec.foundation.KeyedJaggedIds`
per embedding width (a model whose tables share one width, the usual case, has one). For each
width the step makes

- on the host (:meth:`FusedStep.prepare`): each table's ids resolved to rows of the width's
  arena (the resident rows: the store's hot tier, every row for the in-memory baseline), and the
  unique non-resident (cold) ids of each table with each occurrence's index among them;
- one copy of every array the device needs (``staging.py``), the cold rows among them, read from
  the row source in one pass over the tables;
- on the device: one unique over the resident rows' arena indices (the arena index *is* the id
  offset by its table), one gather of those rows joined to the cold rows into one leaf tensor, one
  ``embedding_bag`` pooling every field's bags, the model, one backward, and one row-wise Adagrad
  of every resident row touched (``embedding_store.adagrad_rows``, the store's rule);
- one read back to the host: the step's scores and its two guard flags (loss finite, gradients
  within bounds). Nothing is applied before that read says both hold, so a non-finite step changes
  nothing (:class:`~.step.NonFiniteStep`, as the per-table ``train_step`` raises it);
- the cold rows' gradients handed back to the row source, table by table, on the host.

On CUDA the unique has a fixed shape (:func:`unique_fixed`: padded with the arena's scratch row)
so no step waits for the device to learn a size; the one wait per step is the read back.

Exactness: the rows and scores equal ``step.train_step``'s (one ``embedding_bag`` per field and
table) bit for bit on a CPU when no two fields share a table: every bag sums the same rows in the
same order, and each row's gradient sums its occurrences in the same order (test_fused_step.py).
A table shared by several fields gets its row gradients summed in one pass over all its fields'
occurrences instead of field by field, so its rows may differ in the last bits (float32 sums
in another order; within 1e-6 relative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from streamrec.embedding_store import adagrad_rows, adagrad_rows_np
from streamrec.foundation import EventBatch, KeyedJaggedIds
from streamrec.model import RankingModel, task_logits
from streamrec.model.dlrm import field_tables, pool_sum, table_fields

from .dense_optimizers import DenseOptimizerProtocol
from .stage_clock import StageClock
from .staging import Stager
from .step import GRAD_ABS_MAX, NonFiniteStep, label_matrix, masked_task_losses, task_weights, weighted_losses
from .step_types import RowSource


def unique_fixed(x: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique, inverse)`` of the 1-D int64 ``x`` with a fixed shape: ``unique`` has ``len(x)`` entries,
    the sorted distinct values first and ``fill`` after them; ``unique[inverse] == x``. Every size is known
    before the device runs, so nothing waits for it (``torch.unique`` reads its output size back)."""
    n = x.numel()
    if n == 0:
        return x.clone(), x.clone()
    sx, order = torch.sort(x)
    new = torch.ones(n, dtype=torch.bool, device=x.device)
    new[1:] = sx[1:] != sx[:-1]
    rank = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(rank)
    inverse[order] = rank
    uniq = torch.full_like(x, fill)
    uniq[rank] = sx  # repeated positions receive the same value
    return uniq, inverse


_EMPTY = np.zeros(0, np.int64)


@dataclass
class _Width:
    """The tables of one embedding width, each table's fields contiguous in ``keys``."""

    dim: int
    tables: list[tuple[str, list[str]]]  # (table, its fields in field order), tables in order of first use
    keys: tuple[str, ...] = ()
    table_names: list[str] = field(default_factory=list)
    table_keys: np.ndarray = field(default_factory=lambda: _EMPTY)  # key index where each table starts, then len(keys)

    def __post_init__(self) -> None:
        self.keys = tuple(f for _, fs in self.tables for f in fs)
        self.table_names = [t for t, _ in self.tables]
        self.table_keys = np.cumsum([0, *(len(fs) for _, fs in self.tables)]).astype(np.int64)


@dataclass
class _WidthIds:
    """One width's share of a prepared step (host arrays)."""

    kjt: KeyedJaggedIds
    hot_slots: np.ndarray  # arena index of each resident occurrence
    hot_pos: np.ndarray | None  # their positions in kjt.values; None: every occurrence is resident, in order
    cold_pos: np.ndarray  # positions of the cold occurrences in kjt.values
    cold_inv: np.ndarray  # each cold occurrence's index among the width's cold rows
    cold: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (table, unique cold ids): the cold rows, in order


@dataclass
class PreparedStep:
    """What the host made of a mini-batch before the device runs it (:meth:`FusedStep.prepare`)."""

    batch: EventBatch
    widths: list[_WidthIds]


class FusedStep:
    """Score-before-train steps of ``model`` over every table of ``model_cfg`` (module doc)."""

    def __init__(self, model: RankingModel, opt: DenseOptimizerProtocol, model_cfg, rows: RowSource,
                 device: torch.device, fake_negative: bool = False, clock: StageClock | None = None,
                 weights: Sequence[float] | None = None, fixed_shapes: bool | None = None):
        self.model, self.opt, self.rows, self.device = model, opt, rows, torch.device(device)
        device = self.device
        self.fake_negative = fake_negative
        self.clock = clock if clock is not None else StageClock()
        self.weights = task_weights(model_cfg, weights)
        # a fixed-shape unique where reading a size back would make the host wait (CUDA)
        self.fixed_shapes = device.type == "cuda" if fixed_shapes is None else fixed_shapes
        dims = dict(model_cfg.tables)
        self.fields = list(field_tables(model_cfg))
        by_dim: dict[int, list] = {}
        for t, fs in table_fields(model_cfg).items():
            by_dim.setdefault(int(dims[t]), []).append((t, fs))
        self.widths = [_Width(d, ts) for d, ts in by_dim.items()]
        # the pooled columns come out width by width, each width's fields in its table order; the model
        # takes them in field order: None when the two orders agree (one width, fields grouped by table)
        at, where = 0, {}
        for w in self.widths:
            for f in w.keys:
                where[f] = (at, w.dim)
                at += w.dim
        order = [where[f] for f in self.fields]
        self._columns = None if [o for o, _ in order] == sorted(o for o, _ in order) else order
        self.stager = Stager(device)

    # -- host ---------------------------------------------------------------------------------------
    def prepare(self, batch: EventBatch, prefetch: bool = False) -> PreparedStep:
        """Resolve ``batch``'s ids to resident rows and unique cold ids (host only; reads no row).
        ``prefetch``: also start reading the cold rows in the background (a step that runs later)."""
        with self.clock.stage("ids"):
            out = []
            for w in self.widths:
                kjt = KeyedJaggedIds.from_batch(batch, w.keys)
                ko = kjt.key_offsets
                bounds = ko[w.table_keys]  # where each table's ids start, and where the last one's end
                slots = self.rows.resolve(w.table_names, np.diff(bounds), kjt.values)
                hot = slots >= 0
                if hot.all():
                    out.append(_WidthIds(kjt, slots, None, _EMPTY, _EMPTY))
                    continue
                hp = np.flatnonzero(hot)
                cp = np.flatnonzero(~hot)
                at = np.searchsorted(cp, bounds)  # each table's cold occurrences: cp[at[k]:at[k + 1]]
                cold_inv, cold, n_cold = [], [], 0
                for k, table in enumerate(w.table_names):
                    if at[k] == at[k + 1]:
                        continue
                    uniq, inv = np.unique(kjt.values[cp[at[k]:at[k + 1]]], return_inverse=True)
                    cold_inv.append(inv.reshape(-1) + n_cold)
                    cold.append((table, uniq))
                    n_cold += len(uniq)
                out.append(_WidthIds(kjt, slots[hp], hp, cp, np.concatenate(cold_inv), cold))
        if prefetch:
            with self.clock.stage("lookup"):
                for wi in out:
                    for table, uniq in wi.cold:
                        self.rows.prefetch(table, uniq)
        return PreparedStep(batch, out)

    # -- the step -----------------------------------------------------------------------------------
    def run(self, p: PreparedStep, while_waiting: Callable[[], None] | None = None) -> np.ndarray:
        """Train one prepared mini-batch; its progressive scores ``[B, T]`` (taken before the update).
        ``while_waiting``: host work (the next step's :meth:`prepare`) to do once this step's device work
        is queued and before its results are read back, so the host works while the device does.

        Raises :class:`NonFiniteStep`, having changed nothing, when a loss or a gradient is NaN,
        infinite or beyond ``GRAD_ABS_MAX``."""
        batch, clock, T = p.batch, self.clock, len(self.weights)
        B = len(batch)
        dense, labels, widths = self._to_device(p, self.rows.lookup, with_labels=True)
        with clock.stage("device"):
            pooled, leaves = self._pool_all(p, widths, B, requires_grad=True)
            logits = task_logits(self.model(dense, pooled), T)
            per, _ = masked_task_losses(logits, labels)
            finite = torch.isfinite(per.sum(dim=1))
            terms = weighted_losses(per, batch, logits, self.fake_negative)
            loss = sum(self.weights[t] * terms[:, t].sum() for t in range(T)) / max(1, B)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            grads = [q.grad for q in self.model.parameters() if q.grad is not None]
            grads += [leaf.grad for leaf, _ in leaves if leaf.grad is not None and leaf.grad.numel()]
            # |g| <= GRAD_ABS_MAX is False for NaN too: one check for NaN, inf and overflowing magnitudes
            grads_ok = (torch.stack([(g.abs() <= GRAD_ABS_MAX).all() for g in grads]).all() if grads
                        else torch.ones((), dtype=torch.bool, device=logits.device))
            probs = torch.sigmoid(logits.detach()).float()
            back = torch.cat([probs.reshape(-1), finite.all().float().reshape(1), grads_ok.float().reshape(1)])
        back = self._read_back(back, while_waiting)
        if back[-2] <= 0:
            self.opt.zero_grad(set_to_none=True)
            raise NonFiniteStep(np.flatnonzero(~finite.cpu().numpy()), "the loss of some events is not finite")
        if back[-1] <= 0:
            self.opt.zero_grad(set_to_none=True)
            raise NonFiniteStep(np.arange(B), f"gradients are not finite or beyond +-{GRAD_ABS_MAX:g}")
        with clock.stage("device"):
            self.opt.step()
            cold_grads = [self._update_resident(w, leaf, hu) for w, (leaf, hu) in zip(self.widths, leaves)]
        with clock.stage("update"):
            for wi, g in zip(p.widths, cold_grads):
                if g is not None:
                    at = 0
                    for table, uniq in wi.cold:
                        self.rows.apply_gradients(table, uniq, g[at:at + len(uniq)])
                        at += len(uniq)
            for w, wi in zip(self.widths, p.widths):
                if len(wi.hot_slots):
                    self.rows.mark_hot_written(w.dim, wi.hot_slots)
        return back[:-2].reshape(B, T)

    def _read_back(self, back: torch.Tensor, while_waiting: Callable[[], None] | None) -> np.ndarray:
        """``back`` on the host: its copy is queued behind the step's kernels, ``while_waiting`` runs, then
        the copy is waited for (the step's one wait for the device)."""
        if back.device.type != "cuda":
            if while_waiting is not None:
                while_waiting()
            with self.clock.stage("scores"):
                return back.numpy()
        host = torch.empty(back.shape, dtype=back.dtype, pin_memory=True)
        host.copy_(back, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        if while_waiting is not None:
            while_waiting()
        with self.clock.stage("scores"):
            done.synchronize()
        return host.numpy()

    @torch.no_grad()
    def score(self, p: PreparedStep) -> np.ndarray:
        """Probabilities ``[B, T]`` of a prepared batch by the model as it is (eval mode); reads rows with
        ``peek``, so no tier, cache or count changes."""
        T = len(self.weights)
        dense, _, widths = self._to_device(p, self.rows.peek, with_labels=False)
        was = self.model.training
        self.model.eval()
        try:
            with self.clock.stage("device"):
                pooled, _ = self._pool_all(p, widths, len(p.batch), requires_grad=False)
                probs = torch.sigmoid(task_logits(self.model(dense, pooled), T)).float()
            with self.clock.stage("scores"):
                return probs.cpu().numpy()
        finally:
            self.model.train(was)

    def _to_device(self, p: PreparedStep, read, with_labels: bool):
        """``(dense, labels or None, per width its device arrays)``: every table's cold rows read with
        ``read(table, unique ids, host=True)``, then one copy of everything (``staging.py``)."""
        with self.clock.stage("lookup"):
            colds = []
            for w, wi in zip(self.widths, p.widths):
                parts = [read(t, uniq, host=True) for t, uniq in wi.cold]
                colds.append(torch.cat(parts).numpy() if parts else np.zeros((0, w.dim), np.float32))
        with self.clock.stage("copies"):
            host = [np.ascontiguousarray(p.batch.dense, np.float32)]
            if with_labels:
                host.append(label_matrix(p.batch, len(self.weights)))
            for wi, c in zip(p.widths, colds):
                host += [wi.kjt.offsets, wi.hot_slots, wi.cold_pos, wi.cold_inv, c]
                if wi.hot_pos is not None:
                    host.append(wi.hot_pos)
            dev = self.stager.to_device(host)
        at = 2 if with_labels else 1
        widths = []
        for wi in p.widths:
            n = 5 if wi.hot_pos is None else 6
            widths.append(dev[at:at + n])
            at += n
        return dev[0], (dev[1] if with_labels else None), widths

    def _pool_all(self, p: PreparedStep, widths, B: int, requires_grad: bool):
        """Every field pooled, in field order ``[B, pooled_dim]``, and per width ``(leaf rows, arena rows)``."""
        pooled, leaves = [], []
        for w, wi, arrays in zip(self.widths, p.widths, widths):
            offsets, hot_slots, cold_pos, cold_inv, cold_rows = arrays[:5]
            hot_pos = arrays[5] if len(arrays) > 5 else None
            pooled_w, leaf, hu = self._pool(w, wi, offsets, hot_slots, hot_pos, cold_pos, cold_inv, cold_rows, B,
                                            requires_grad)
            pooled.append(pooled_w)
            leaves.append((leaf, hu))
        return self._field_order(pooled, B), leaves

    def _pool(self, w: _Width, wi: _WidthIds, offsets, hot_slots, hot_pos, cold_pos, cold_inv, cold_rows, B: int,
              requires_grad: bool):
        """One width's pooled fields ``[B, len(keys) * dim]``, its leaf rows and the unique arena rows."""
        arena = self.rows.arena(w.dim)
        if self.fixed_shapes:
            hu, hinv = unique_fixed(hot_slots, arena.scratch)
        else:
            hu, hinv = torch.unique(hot_slots, return_inverse=True)
        nh = hu.numel()
        leaf = (torch.cat([arena.w[hu], cold_rows]) if cold_rows.numel() else arena.w[hu]).detach()
        if requires_grad:
            leaf.requires_grad_(True)
        if hot_pos is None:
            index = hinv
        else:
            index = torch.empty(len(wi.kjt.values), dtype=torch.int64, device=hinv.device)
            index[hot_pos] = hinv
            index[cold_pos] = cold_inv + nh
        bags = pool_sum(leaf, index, offsets)
        nf = len(w.keys)
        return bags.view(nf, B, w.dim).transpose(0, 1).reshape(B, nf * w.dim), leaf, hu

    def _field_order(self, pooled: list[torch.Tensor], B: int) -> torch.Tensor:
        if not pooled:
            return torch.zeros((B, 0), device=self.device)
        flat = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)
        if self._columns is None:
            return flat
        return torch.cat([flat[:, o:o + d] for o, d in self._columns], dim=1)

    def _update_resident(self, w: _Width, leaf: torch.Tensor, hu: torch.Tensor) -> torch.Tensor | None:
        """Row-wise Adagrad of the width's touched resident rows in its arena; the cold rows' gradients
        on the host (None: no cold rows)."""
        g = leaf.grad
        if g is None:
            return None
        nh = hu.numel()
        arena = self.rows.arena(w.dim)
        lr, eps = self.rows.lr, self.rows.eps
        if nh:
            if arena.w.device.type == "cpu":  # numpy: the same IEEE operations without torch's per-op dispatch
                s = hu.numpy()
                aw, aa = arena.w.numpy(), arena.acc.numpy()
                aw[s], aa[s] = adagrad_rows_np(aw[s], aa[s], g[:nh].numpy(), lr, eps)
            else:  # padded entries (fixed shapes) all land on the scratch row
                w_new, acc_new = adagrad_rows(arena.w[hu], arena.acc[hu], g[:nh], lr, eps)
                arena.w[hu] = w_new
                arena.acc[hu] = acc_new
        if leaf.shape[0] == nh:
            return None
        return g[nh:].cpu()
