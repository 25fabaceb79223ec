"""One rank of a trainer group: :class:`TrainerCore` with row-wise sharded embeddings.

Every rank trains the same dense network (synchronous: gradients are summed over
the group with one ``all_reduce`` per step, so every rank takes the same optimizer
step) on its own events, and owns the embedding rows :func:`owner_of` gives it, in
its own store (hot rows on its device, cold rows in its RocksDB shard). A step
fetches rows from their owners and returns the gradients to them
(:class:`RowExchange`, keyed by table: a table shared by several fields is fetched
once); the loss is the group's mean, so N ranks whose batches together make one
trainer's batch apply the update that trainer would. With several tasks each rank
divides its masked sum of task ``t``'s losses by the group's batch size, as one
trainer divides by its own (``trainer/step.py``); a fake-negative stream's events are weighed
as one trainer weighs them (each event's weight is its own, so the group's sum is one trainer's).

Steps are collectives: every rank runs the same number per window (the largest
plan of any rank); a rank with fewer mini-batches, or none, joins with empty ones.
The numerical guard is collective too: a step whose loss or gradients are not
finite anywhere in the group is applied nowhere, and every rank retries the same
way (without its own non-finite events, or in halves), so the group never
diverges and a poisoned event costs at most a few extra steps.

Wire precision (TorchRec's quantized comms, DDP's ``bf16_compress_hook``):
``trainer.exchange_precision`` sets how rows and row gradients travel (:mod:`.sharding`);
how the dense gradients are summed (``trainer.dense_allreduce_precision``, and PowerSGD's
low-rank compression, ``trainer.dense_allreduce_compression``) is :mod:`.dense_sync`'s.
Master weights, the optimizer's state and every owner's rows and Adagrad state stay fp32.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Mapping

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from streamrec.embedding_store import note_occurrences
from streamrec.foundation import EventBatch
from streamrec.foundation.failpoints import hit
from streamrec.model import pool_sum, task_logits, unique_ids

from .batch_sizes import BatchSizes, batch_sizes
from .core import TrainerCore, WindowResult
from .dense_sync import COMPRESSIONS, WIRE as _WIRE, DenseSync, ring_bytes
from .schedule import hot_samples, plan
from .sharding import RowExchange, owned_part
from .step import GRAD_ABS_MAX, label_matrix, masked_task_losses, weighted_losses

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.joiner.join_config import JoinConfig
    from streamrec.trainer.trainer_config import TrainerConfig

log = logging.getLogger(__name__)

_OK, _BAD_LOSS, _BAD_GRAD = 0, 1, 2


class ShardedTrainerCore(TrainerCore):
    """``TrainerCore`` for rank ``rank`` of ``world``; ``torch.distributed`` must be initialised.

    ``trainer.group_batch = "group"`` (the default): ``trainer.batch_size`` is the group's
    batch, each rank plans mini-batches of ``batch_size // world`` events, so a step trains on
    about ``batch_size`` events in all and the learning rate means what it means for one
    trainer (the group is exact). ``"rank"``: each rank plans ``batch_size`` events per step
    (TorchRec's and PERSIA's per-worker batch), so a group step trains ``world x batch_size``
    events; every rank pays the step's fixed per-field cost for a full batch instead of a
    1/world slice of one (the CPU per event that the "group" split costs)."""

    def __init__(self, model: ModelConfig, trainer: TrainerConfig, store, device: torch.device, rank: int,
                 world: int, group=None, comm_device: torch.device | str = "cpu", *,
                 store_cfg: StoreConfig | None = None, join: JoinConfig | None = None,
                 sizes: BatchSizes | None = None):
        if (store_cfg is not None and store_cfg.admit_min_count >= 2 and store_cfg.unadmitted == "shared"
                and int(world) > 1):
            from streamrec.foundation import ConfigError

            # each rank's store would keep a shared row of its own for the ids it owns: not one model any more
            raise ConfigError("store.unadmitted = \"shared\" needs one trainer; a trainer group admits ids with "
                              "store.unadmitted = \"zero\" (set it, or store.admit_min_count = 0)")
        super().__init__(model, trainer, store, device, store_cfg=store_cfg, join=join,
                         sizes=sizes if sizes is not None else batch_sizes(trainer, world))
        self.rank, self.world, self.group = int(rank), int(world), group
        self.comm = torch.device(comm_device)
        self.local_batch = self.sizes.step
        t = trainer
        self.tables = list(model.tables)  # the exchange's keys: each table once, in order of first use
        self.table_fields: dict[str, list[str]] = {}
        for f, tb in self.field_tables.items():
            self.table_fields.setdefault(tb, []).append(f)
        self.task_weights = [float(tk.weight) for tk in model.tasks]
        self.exchange = RowExchange(dict(model.tables), None, store.lookup, store.apply_gradients,
                                    self.rank, self.world, group, comm_device=self.comm,
                                    precision=t.exchange_precision,
                                    note=functools.partial(note_occurrences, store)
                                    if self.counts_occurrences else None)
        self._hot_all: dict[str, np.ndarray] = {}  # the whole group's hot set (plans need it; rows live with owners)
        self.steps = 0
        self.windows = 0
        self._params = [p for p in self.model.parameters()]
        with torch.no_grad():  # one starting point for every rank, whatever their seeds did
            for p in self._params:
                buf = p.data.to(self.comm)
                dist.broadcast(buf, 0, group=group)
                p.data.copy_(buf.to(p.device))
        self.dense_sync = DenseSync(t, self._params, self.rank, self.world, group, self.comm)
        # what the group's metrics put on the wire from this rank (a histogram all-reduce and the sliding
        # window's all-gather per metrics record): time-driven, not per event, so counted apart
        self.metrics_bytes_sent = 0

    # the dense sum's figures (dense_sync.py): bytes a ring all-reduce puts on the wire from this rank, fp16 sums
    # redone in fp32, the fp16 scale (the same on every rank)
    dense_bytes_sent = property(lambda self: self.dense_sync.bytes_sent)
    dense_fp32_retries = property(lambda self: self.dense_sync.fp32_retries)
    dense_scale = property(lambda self: self.dense_sync.scale, lambda self, v: setattr(self.dense_sync, "scale", v))

    # -- hot set ---------------------------------------------------------------
    def apply_hot_set(self, version: int, tables: Mapping[str, np.ndarray]):
        """The group's hot set: this rank's store takes the rows it owns; plans use the whole set."""
        known = set(self.field_tables.values())
        tables = {t: np.unique(np.asarray(ids, dtype=np.int64)) for t, ids in tables.items() if t in known}
        mine = owned_part(tables, self.rank, self.world)
        total, cap = sum(len(v) for v in mine.values()), int(self.store.hot_capacity_rows)
        if total > cap:
            log.warning("hot set v%d gives rank %d %d rows, over its hot tier's %d: cut to fit", version, self.rank,
                        total, cap)
            mine = {t: ids[: len(ids) * cap // total] for t, ids in mine.items()}
        stats = self.store.set_hot(mine)
        self._hot_all = tables
        self.hot_version = int(version)
        self.hot_rows = int(sum(len(v) for v in tables.values()))
        log.info("hot set v%d applied: %d rows in the group, %d owned here (%s)", version, self.hot_rows,
                 sum(len(v) for v in mine.values()), stats)
        return stats

    def hot_mask(self, field: str, ids: np.ndarray) -> np.ndarray:
        hot = self._hot_all.get(self.field_tables.get(field, field))
        if hot is None or not len(hot):
            return np.zeros(len(ids), bool)
        at = np.minimum(np.searchsorted(hot, ids), len(hot) - 1)
        return hot[at] == ids

    # -- training ------------------------------------------------------------
    def plan(self, batch: EventBatch):
        t = self.trainer_cfg
        hot_on = t.schedule == "fae" and self.hot_rows
        hot = hot_samples(batch, self.fields, self.hot_mask) if hot_on else np.zeros(len(batch), dtype=bool)
        return plan(hot, self.local_batch, t.schedule if self.hot_rows else "arrival", t.hot_per_cold)

    def _steps_for(self, n: int) -> int:
        """The group's step count for this window (the largest plan); checks that every rank is at the same
        window, so a caller that calls ``train_window`` unevenly gets this error, not a gloo size mismatch."""
        self.windows += 1
        t = self.trainer_cfg
        # the settings every rank must share (the ranks would misread each other's rows, gradients, steps or
        # PowerSGD factors otherwise): wire formats, the per-rank batch, the dense sum's compression
        mine = [list(_WIRE).index(t.exchange_precision), list(_WIRE).index(t.dense_allreduce_precision),
                self.local_batch, COMPRESSIONS.index(t.dense_allreduce_compression), t.powersgd_rank,
                t.powersgd_start_iter]
        x = torch.tensor([n, self.windows, -self.windows, *mine, *(-v for v in mine)], dtype=torch.int64,
                         device=self.comm)
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        most, newest, oldest, *rest = (int(v) for v in x.cpu())
        if newest != -oldest:
            raise RuntimeError(f"rank {self.rank} is at window {self.windows} while others are at {-oldest}..{newest}: "
                               "every rank must call train_window once per window (None when idle)")
        k = len(mine)
        if rest[:k] != [-v for v in rest[k:]]:
            raise RuntimeError(f"rank {self.rank} has trainer.exchange_precision={t.exchange_precision!r}, "
                               f"trainer.dense_allreduce_precision={t.dense_allreduce_precision!r}, "
                               f"{self.local_batch} events per rank step (trainer.batch_size={t.batch_size}, "
                               f"trainer.group_batch={t.group_batch!r}), "
                               f"trainer.dense_allreduce_compression={t.dense_allreduce_compression!r}, "
                               f"trainer.powersgd_rank={t.powersgd_rank} and trainer.powersgd_start_iter="
                               f"{t.powersgd_start_iter}; another rank has other values: every rank of a group must "
                               "use the same config")
        return most

    def train_window(self, batch: EventBatch | None) -> WindowResult:
        """Train this rank's window (``None`` or empty: an idle rank) in lockstep with the group."""
        if batch is None:
            batch = EventBatch.empty(self.model_cfg.dense_dim, self.fields)
        self.model.train()
        scores = np.zeros((len(batch), len(self.task_names)), np.float32)
        mbs = self.plan(batch)
        steps = self._steps_for(len(mbs))
        empty = np.zeros(0, np.int64)
        hot_n, rejected, reasons = 0, [], []
        for i in range(steps):
            rows = mbs[i].rows if i < len(mbs) else empty
            p, bad, why = self._guarded_step(batch.take(rows), None)
            scores[rows] = p
            if len(bad):
                rejected.append(rows[bad])
            if why:
                reasons.append(why)
            if i < len(mbs) and mbs[i].kind == "hot":
                hot_n += len(rows) - len(bad)
        return self._finish_window(batch, scores, rejected, reasons, hot_n, steps)

    def _guarded_step(self, sub: EventBatch, uniques) -> tuple[np.ndarray, np.ndarray, str]:
        """The collective form of ``TrainerCore._guarded_step``: every decision is taken on
        group-wide figures, so every rank runs the same number of retries."""
        scores = np.full((len(sub), len(self.task_names)), np.nan, np.float32)
        bad: list[np.ndarray] = []
        why: list[str] = []
        todo = [np.arange(len(sub))]
        while todo:
            rows = todo.pop()
            part = sub if len(rows) == len(sub) else sub.take(rows)
            status, p, culprits, sizes, flagged = self._step_group(part)
            if status == _OK:
                scores[rows] = p
                continue
            self.nonfinite_batches += 1
            if status == _BAD_LOSS:  # some rank has events whose own loss is not finite: drop those, retry
                why.append("non-finite training step: the loss of some events is not finite")
                bad.append(rows[culprits])
                todo.append(np.delete(rows, culprits))
                continue
            why.append(f"non-finite training step: gradients are not finite or beyond +-{GRAD_ABS_MAX:g}")
            suspects = flagged if flagged.any() else sizes > 0  # no rank saw it alone: only the sum overflowed
            empty = rows[:0]
            if not suspects[self.rank]:  # this rank's events are fine: train them again beside the search
                todo += [rows] if int(sizes[suspects].max()) <= 1 else [empty, rows]
            elif int(sizes[suspects].max()) <= 1:  # down to single events: these are the culprits
                bad.append(rows)
                todo.append(empty)
            else:
                half = len(rows) // 2
                todo += [rows[:half], rows[half:]]
        out = np.sort(np.concatenate(bad)) if bad else np.zeros(0, np.int64)
        reason = "; ".join(dict.fromkeys(why))
        if len(out) or why:
            log.warning("rank %d mini-batch of %d events: %s; %d events here not trained (dead-lettered)", self.rank,
                        len(sub), reason, len(out))
        return scores, out, reason

    def _step_group(self, sub: EventBatch):
        """One synchronous step of the group: ``(status, scores, local culprits, every rank's batch size,
        which ranks saw non-finite gradients of their own)``."""
        T = len(self.task_names)
        uniq = unique_ids(sub, self.model_cfg)
        counts = ({tb: np.bincount(uniq[tb][1], minlength=len(uniq[tb][0])) for tb in self.tables}
                  if self.exchange.note is not None else None)  # admission counts occurrences, at the owners
        rows, sizes = self.exchange.fetch({tb: uniq[tb][0] for tb in self.tables}, len(sub), counts)
        hit("group.mid_step")  # rows fetched from their owners, gradients not returned
        total = int(sizes.sum())
        no_flags = np.zeros(self.world, bool)
        if total == 0:
            return _OK, np.zeros((0, T), np.float32), np.zeros(0, np.int64), sizes, no_flags
        dev = self.device
        labels = torch.from_numpy(label_matrix(sub, T)).to(dev)
        counts = [total] * T  # every task's masked sum over the group's batch size, as one trainer's step
        # one embedding_bag per field; one trainer's fused step pools every field at once, and pool_sum's
        # backward adds a row's occurrences in index order, so both give the same rows to the last bit where
        # no two fields share a table (a shared table's rows may differ in the last bits: fused_step.py)
        pooled, leaves = {}, {}
        for tb in self.tables:
            r = rows[tb].to(dev).detach().requires_grad_(True)
            leaves[tb] = r
            index = torch.from_numpy(uniq[tb][1].astype(np.int64, copy=False)).to(dev)
            at = 0
            for f in self.table_fields[tb]:
                j = sub.sparse[f]
                n = len(j.values)
                idx = index if len(self.table_fields[tb]) == 1 else index[at:at + n]
                at += n
                pooled[f] = pool_sum(r, idx, torch.from_numpy(j.offsets).to(dev))
        pooled_t = torch.cat([pooled[f] for f in self.fields], dim=1) if self.fields else \
            torch.zeros((len(sub), 0), device=dev)
        logits = task_logits(self.model(torch.from_numpy(sub.dense).to(dev), pooled_t), T)
        per, _ = masked_task_losses(logits, labels)
        per_event = per.sum(dim=1)
        finite = torch.isfinite(per_event)
        culprits = np.flatnonzero(~finite.cpu().numpy())
        self.opt.zero_grad(set_to_none=True)
        grad_bad = 0
        if not len(culprits):
            # the group's mean loss per task: ranks' gradients sum to one trainer's
            terms = weighted_losses(per, sub, logits, self.fake_negative)  # the fake-negative weights (step.py)
            loss = sum(self.task_weights[t] * (terms[:, t].sum() / max(1, counts[t])) for t in range(T))
            loss.backward()
            local = [r.grad for r in leaves.values() if r.grad is not None and len(r.grad)]
            local += [p.grad for p in self._params if p.grad is not None]
            grad_bad = int(bool(local) and not bool(torch.stack([(g.abs() <= GRAD_ABS_MAX).all() for g in local]).all()))
        flags = torch.zeros(self.world + 1, device=self.comm)  # [any event with a non-finite loss, rank r's grads bad]
        flags[0], flags[1 + self.rank] = float(len(culprits) > 0), float(grad_bad)  # 0/1: exact in any precision
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self.comm)
                          for p in self._params])
        grads, flags = self.dense_sync(flat, flags)  # the group's sums, fp32 (wire format, PowerSGD: dense_sync.py)
        self.steps += 1
        flags = flags.cpu().numpy()
        if flags[0] > 0:
            self.opt.zero_grad(set_to_none=True)
            return _BAD_LOSS, np.zeros((0, T), np.float32), culprits, sizes, no_flags
        if flags[1:].any() or not bool((grads.abs() <= GRAD_ABS_MAX).all()):
            self.opt.zero_grad(set_to_none=True)
            return _BAD_GRAD, np.zeros((0, T), np.float32), culprits, sizes, flags[1:] > 0
        at = 0
        for p in self._params:
            n = p.numel()
            p.grad = grads[at:at + n].view_as(p).to(p.device)
            at += n
        self.opt.step()
        self.exchange.give_back({tb: leaves[tb].grad for tb in self.tables})
        return _OK, torch.sigmoid(logits.detach()).float().cpu().numpy(), culprits, sizes, no_flags

    # -- state: the dense sum's (PowerSGD's Q and step count are the group's, its error feedback this rank's) --------
    def dense_state(self):
        return {**super().dense_state(), "dense_sync": self.dense_sync.group_state()}

    def rank_dense_state(self):
        """What this rank's shard keeps beside its rows: the PowerSGD error feedback."""
        return {"dense_sync_rank": self.dense_sync.rank_state()}

    def load_dense_state(self, d) -> None:
        """The manifest's dense state, and this rank's ``rank_dense_state`` under ``dense_sync_rank`` when its
        own shard had one (absent after a reshard: the error feedback starts at zero)."""
        super().load_dense_state(d)
        self.dense_sync.load_state(d.get("dense_sync"), d.get("dense_sync_rank"))

    can_predict = False

    def predict(self, batch: EventBatch) -> np.ndarray:
        raise NotImplementedError("a rank of a group scores inside its training steps; serving predicts")

    # -- group-wide figures ------------------------------------------------------
    def group_task_figures(self) -> dict[str, dict]:
        """Per task, the group's since-start ``auc``, ``logloss`` and ``labelled`` (collectives, one per task;
        every rank has the same tasks): the group's form of :meth:`task_figures`."""
        out = {}
        for name in self.task_names:
            g = self.group_metrics(name)
            out[name] = {"auc": g.auc, "logloss": g.logloss, "labelled": int(g.count)}
        return out

    def group_metrics(self, task: str | None = None):
        """The group's figures (a collective) of ``task`` (default the first): since-start AUC/logloss from the
        histograms and totals summed over ranks; the sliding window from every rank's newest ``window / N``
        events (one rank's own window alone reaches N times further back in the stream)."""
        from .metrics import StreamingMetrics

        m = self.metrics if task is None else self.task_metrics[task]
        vec = torch.from_numpy(np.concatenate([m.pos, m.neg, [m.loss_total, float(m.count)]])).to(self.comm)
        dist.all_reduce(vec, group=self.group)
        self.metrics_bytes_sent += ring_bytes(vec.numel(), vec.element_size(), self.world)
        v = vec.cpu().numpy()
        b = m.bins
        g = StreamingMetrics(self.trainer_cfg.metrics_window, bins=b)

        def totals():  # copies: update() adds to pos/neg in place, and the sums must not take the window twice
            return {"pos": v[:b].copy(), "neg": v[b:2 * b].copy(), "loss_total": float(v[2 * b]),
                    "count": int(v[2 * b + 1])}

        g.load_state(totals())
        share = max(1, m.window // self.world)
        ys_mine, ps_mine = m.newest(share)  # this rank's newest events, oldest first
        n = len(ys_mine)
        mine = np.zeros((2, share + 1), np.float32)
        mine[0, :n], mine[1, :n], mine[0, share] = ys_mine, ps_mine, n
        got = [torch.empty((2, share + 1), dtype=torch.float32, device=self.comm) for _ in range(self.world)]
        dist.all_gather(got, torch.from_numpy(mine).to(self.comm), group=self.group)
        self.metrics_bytes_sent += (self.world - 1) * mine.nbytes  # a ring all-gather passes on every other piece
        ys, ps = [], []
        for t in got:
            a = t.cpu().numpy()
            k = int(a[0, share])
            ys.append(a[0, :k])
            ps.append(a[1, :k])
        g.update(np.concatenate(ys), np.concatenate(ps))  # only the window matters: the totals were set above
        g.load_state(totals())
        return g
