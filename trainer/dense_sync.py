"""The dense gradients' sum over a trainer group: one all-reduce per step, optionally compressed.

Moved out of :mod:`.sharded_core` (whose group step calls :class:`DenseSync`), so the wire
format of the dense sum is one module's business.

Wire precision (``trainer.dense_allreduce_precision``, DDP's ``bf16_compress_hook``): ``bf16``
casts the gradients for the all-reduce and back; ``fp16`` multiplies them by a loss-scale-like
power of two first (every rank holds the same one), and a step whose fp16 sum overflows is
summed again in fp32 and halves the scale (doubled again after ``_SCALE_GROWTH`` clean steps),
so a compressed sum never turns into a refused step.

Low-rank compression (``trainer.dense_allreduce_compression = "powersgd"``): PowerSGD (Vogels,
Karimireddy and Jaggi, NeurIPS 2019) as torch's DDP hook does it
(``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``, ``powerSGD_hook``). That hook
takes a ``dist.GradBucket``, which has no Python constructor (torch 2.13), so it cannot be called
without DDP; this is the same algorithm, with torch's own ``_orthogonalize`` and
``_should_compress``:

1. ``M = grad + error`` (error feedback, per rank, over every dense gradient as in torch's hook);
2. 1-D tensors and matrices that do not pay (``(n + m) r * 2 >= n m``, torch's
   ``min_compression_rate = 2``) are summed uncompressed, with the guard's flags;
3. each other weight, viewed as ``(shape[0], -1)``: ``P = M Q``, all-reduce all Ps,
   orthogonalise, ``Q = M^T P``, all-reduce all Qs in one buffer, the sum ``~ P Q^T``.

Torch all-reduces the uncompressed tensors and the Ps as two buffers (overlapped, asynchronous);
here they travel as one (uncompressed rest, flags, Ps), so a step costs two collectives instead of
three: on a CPU group each gloo round's fixed cost per rank outweighs the compression's arithmetic
(BENCHMARKS.md, scale). With the fp16 wire the rest goes first on
its own (its scale and fp32 retry), the Ps after it in bf16.
4. the new error is ``M - sum / world`` (torch: ``M - mean``), and Q is kept for the next step
   (warm start; the first Q is drawn from ``torch.manual_seed(RandomState(0).randint(1e9))`` and
   orthogonalised, so every rank starts from the same one).

One difference: torch averages (``/ world``), here the ranks' gradients already sum to the group
mean loss's gradient (:mod:`.sharded_core`), so the approximation is the sum ``P Q^T``. The first
``trainer.powersgd_start_iter`` applied steps are summed uncompressed (torch's
``start_powerSGD_iter``). P and Q travel in fp32 with ``dense_allreduce_precision = "fp32"`` and
in bf16 otherwise (bf16 keeps fp32's range, so no factor needs a scale; the error feedback is
computed from the rounded sums and so carries their rounding into the next step). Columns are
orthogonalised with ``epsilon = 1e-8``: a layer whose gradient is zero on every rank gives a zero
approximation, not NaN (torch's Gram-Schmidt divides by a zero norm with its default 0).

The numerical guard: the flags travel uncompressed with the first all-reduce, every step, summed
exactly (0/1 counts in any of the formats); a step they refuse sends no Q. A step is applied only when the
flags are all zero and the summed gradients are finite and within ``GRAD_ABS_MAX`` (the test
``ShardedTrainerCore._step_group`` makes); only then are the error feedback, Q and the step count
replaced, so a refused step leaves the compressor as it was. A P or Q sum that is not finite, or whose
size proves the exact sum beyond ``GRAD_ABS_MAX`` (:meth:`DenseSync._beyond`), makes the compressed
gradients NaN, so the guard refuses the step as it refuses an uncompressed sum that overflowed.
Every rank computes the same P, Q and sum from the same all-reduced buffers, so every rank takes
the identical step.

State: Q and the count of applied steps are the group's (the same on every rank; rank 0's manifest
keeps them with the dense weights); the error feedback is each rank's own (its shard keeps it), so
a group restarted from a checkpoint continues the same trajectory. A reshard to another world size
starts the error feedback at zero (its ranks hold other events' residuals); Q is kept.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence, get_args

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize, _should_compress

from .step import GRAD_ABS_MAX
from .trainer_types import Compression

log = logging.getLogger(__name__)

WIRE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPRESSIONS = get_args(Compression)  # trainer.dense_allreduce_compression; a rank sends the index
_SCALE_START, _SCALE_MAX, _SCALE_GROWTH = 2.0 ** 10, 2.0 ** 24, 200  # fp16 dense all-reduce: dynamic scale
MIN_COMPRESSION_RATE = 2  # torch's default: a matrix is compressed when (n + m) r * 2 < n m
ORTHO_EPSILON = 1e-8
Q_SEED = 0  # torch's PowerSGDState(random_seed=0)


def ring_bytes(numel: int, element_size: int, world: int) -> int:
    """What a ring all-reduce of ``numel`` elements puts on the wire per rank: 2 (N-1)/N of the buffer."""
    return 2 * (world - 1) * numel * element_size // world


class DenseSync:
    """The group's sum of the dense gradients of ``params`` (shapes only are read), as configured by
    ``trainer_cfg``. Every rank must use the same settings (:class:`.sharded_core.ShardedTrainerCore`
    checks them, with the rest of the group's, at every window)."""

    def __init__(self, trainer_cfg, params: Sequence[torch.Tensor], rank: int, world: int, group=None,
                 comm: torch.device | str = "cpu"):
        t = trainer_cfg
        self.rank, self.world, self.group, self.comm = int(rank), int(world), group, torch.device(comm)
        self.precision, self.compression = t.dense_allreduce_precision, t.dense_allreduce_compression
        self.wire = WIRE[self.precision]
        self.factor_wire = torch.float32 if self.wire is torch.float32 else torch.bfloat16  # P and Q
        self.rank_k, self.start_iter = int(t.powersgd_rank), int(t.powersgd_start_iter)
        self.scale, self._clean_steps = _SCALE_START, 0  # fp16 only; the same on every rank (same sums)
        self.fp32_retries = 0  # fp16 sums that overflowed and were summed again in fp32
        self.bytes_sent = 0  # ring all-reduce bytes on the wire from this rank
        self.iter = 0  # dense steps applied (the warm-up counts these)
        self.numel = sum(p.numel() for p in params)
        # the layout: which parameters are compressed (offset, rows n, cols m, rank r) and which are not
        self.matrices: list[tuple[int, int, int, int]] = []
        plain: list[torch.Tensor] = []
        at = 0
        for p in params:
            n = p.numel()
            rows, cols = (p.shape[0], n // p.shape[0]) if p.dim() > 1 and n else (0, 0)
            r = min(rows, cols, self.rank_k)
            if self.compression == "powersgd" and r and _should_compress(rows, cols, r, MIN_COMPRESSION_RATE)[0]:
                self.matrices.append((at, rows, cols, r))
            else:
                plain.append(torch.arange(at, at + n))
            at += n
        self.plain_index = torch.cat(plain) if plain else torch.zeros(0, dtype=torch.int64)
        self.p_numel = sum(n * r for _, n, _, r in self.matrices)
        self.q_numel = sum(m * r for _, _, m, r in self.matrices)
        # what a P / Q entry may reach while the exact sum is within GRAD_ABS_MAX (see _beyond), per entry
        self._p_bound = torch.cat([torch.full((n * r,), GRAD_ABS_MAX * m ** 0.5) for _, n, m, r in self.matrices]
                                  or [torch.zeros(0)]).to(self.comm)
        self._q_bound = torch.cat([torch.full((m * r,), GRAD_ABS_MAX * n ** 0.5) for _, n, m, r in self.matrices]
                                  or [torch.zeros(0)]).to(self.comm)
        self.q: list[torch.Tensor] | None = None  # the group's Qs (warm start), None until the first compressed step
        self.error: torch.Tensor | None = None  # this rank's error feedback, None = zero

    # -- the sum ---------------------------------------------------------------------
    def __call__(self, flat: torch.Tensor, flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's sum of ``flat`` (this rank's dense gradients, fp32 on the comm device) and of
        ``flags``, both fp32; counts the bytes, and keeps the compressor's state only when the sum is
        one the guard applies (see the module docstring)."""
        if self.compression == "none" or not self.matrices or self.iter < self.start_iter:
            grads, flags = self._sum_plain(flat, flags)
            if self._applied(grads, flags):
                self.iter += 1
            return grads, flags
        return self._sum_powersgd(flat, flags)

    def _applied(self, grads: torch.Tensor, flags: torch.Tensor) -> bool:
        return not bool(flags.any()) and bool((grads.abs() <= GRAD_ABS_MAX).all())

    def _all_reduce(self, buf: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(buf, group=self.group)
        self.bytes_sent += ring_bytes(buf.numel(), buf.element_size(), self.world)
        return buf

    def _sum_plain(self, flat: torch.Tensor, flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Uncompressed, in ``trainer.dense_allreduce_precision``: gradients and flags in one buffer."""
        k = len(flags)
        if self.wire is torch.float32:
            buf = torch.cat([flat, flags])
        elif self.wire is torch.bfloat16:
            buf = torch.cat([flat, flags]).to(torch.bfloat16)
        else:
            buf = torch.cat([flat * self.scale, flags]).to(torch.float16)
        self._all_reduce(buf)
        grads, flags = buf[:-k].float(), buf[-k:].float()
        if self.wire is not torch.float16:
            return grads, flags
        grads = grads / self.scale
        if bool(flags.any()) or bool(torch.isfinite(grads).all()):  # a refused step says so in fp32 as well
            self._clean_steps += 1
            if self._clean_steps >= _SCALE_GROWTH and self.scale < _SCALE_MAX:
                self.scale, self._clean_steps = self.scale * 2, 0
            return grads, flags
        # every rank sees the same overflowed sum, so every rank takes this branch: sum again in fp32
        self.scale, self._clean_steps = max(self.scale / 2, 2.0 ** -24), 0
        self.fp32_retries += 1
        return self._all_reduce(flat.clone()), flags  # the flags are known (all zero): only the gradients again

    def _sum_powersgd(self, flat: torch.Tensor, flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m_all = flat if self.error is None else flat + self.error  # torch: input_tensor.add_(error)
        qs = self._start_qs()
        mats = [m_all[o:o + n * m].view(n, m) for o, n, m, _ in self.matrices]
        pbuf = torch.cat([(mat @ q).reshape(-1) for mat, q in zip(mats, qs)])
        out = torch.zeros_like(flat)
        k, n_rest = len(flags), len(self.plain_index)
        if self.wire is self.factor_wire:  # fp32 / bf16: the rest, the flags and every P in one all-reduce
            buf = self._all_reduce(torch.cat([m_all[self.plain_index], flags, pbuf]).to(self.wire)).float()
            out[self.plain_index], flags, pbuf = buf[:n_rest], buf[n_rest:n_rest + k], buf[n_rest + k:]
        else:  # fp16: the rest with its scale (and its fp32 retry) first, the Ps in bf16 after
            rest, flags = self._sum_plain(m_all[self.plain_index], flags)
            out[self.plain_index] = rest
            if not bool(flags.any()):
                pbuf = self._all_reduce(pbuf.to(self.factor_wire)).float()
        if bool(flags.any()):  # refused whatever P and Q say: no Q is sent, nothing is kept
            return out, flags
        if self._beyond(pbuf, self._p_bound):
            return self._refused(out), flags
        ps, at = [], 0
        for _, n, _, r in self.matrices:
            p = pbuf[at:at + n * r].view(1, n, r)
            _orthogonalize(p, ORTHO_EPSILON)
            ps.append(p[0])
            at += n * r
        qbuf = torch.cat([(mat.t() @ p).reshape(-1) for mat, p in zip(mats, ps)])
        qbuf = self._all_reduce(qbuf.to(self.factor_wire)).float()
        if self._beyond(qbuf, self._q_bound):
            return self._refused(out), flags
        new_qs, at = [], 0
        for (o, n, m, r), p in zip(self.matrices, ps):
            q = qbuf[at:at + m * r].view(m, r)
            out[o:o + n * m] = (p @ q.t()).reshape(-1)
            new_qs.append(q)
            at += m * r
        if self._applied(out, flags):
            self.error = m_all - out / self.world  # torch: input_tensor_cp - (the group's mean)
            self.q = new_qs
            self.iter += 1
        return out, flags

    @staticmethod
    def _beyond(buf: torch.Tensor, bound: torch.Tensor) -> bool:
        """Whether a summed P (or Q) shows that the exact sum ``S`` is not one the guard applies. A column
        of P is ``S q`` with ``|q| = 1``, so ``|P_ij| <= |row i of S| <= sqrt(m) max|S|``: an entry beyond
        ``sqrt(m) GRAD_ABS_MAX`` (or not finite) means some entry of ``S`` is beyond ``GRAD_ABS_MAX``.
        Without this a sum that overflowed could vanish in the orthogonalisation (a column norm of inf
        normalises it to 0) and the step would apply a zero gradient instead of being refused. (For Q,
        ``(S^T P)_kj``, the same with the rows: ``sqrt(n)``.) ``bound`` holds each entry's limit."""
        return not bool((buf.abs() <= bound).all())  # False for NaN as well

    def _refused(self, out: torch.Tensor) -> torch.Tensor:
        """The sum with every compressed gradient NaN: the guard refuses it, as it refuses a non-finite sum
        (every rank saw the same buffer, so every rank stops here, before the next all-reduce)."""
        for o, n, m, _ in self.matrices:
            out[o:o + n * m] = float("nan")
        return out

    def _start_qs(self) -> list[torch.Tensor]:
        """This step's Qs, orthogonalised: the last applied step's (warm start), or torch's seeded draw."""
        if self.q is None:
            rng = np.random.RandomState(Q_SEED)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(rng.randint(1_000_000_000))
                qs = [torch.randn(1, m, r, dtype=torch.float32) for _, _, m, r in self.matrices]
        else:
            qs = [q.clone().unsqueeze(0) for q in self.q]
        for q in qs:
            _orthogonalize(q, ORTHO_EPSILON)
        return [q[0].to(self.comm) for q in qs]

    # -- state -----------------------------------------------------------------------
    def group_state(self) -> dict[str, Any]:
        """What every rank holds alike (rank 0's manifest keeps it): applied steps, Qs, the fp16 scale."""
        return {"iter": self.iter, "scale": self.scale, "clean_steps": self._clean_steps,
                "layout": [list(x) for x in self.matrices],
                "q": [q.detach().cpu().clone() for q in self.q] if self.q is not None else None}

    def rank_state(self) -> dict[str, Any]:
        """This rank's own (its shard keeps it): the error feedback, and the world it belongs to."""
        return {"world": self.world, "numel": self.numel,
                "error": self.error.detach().cpu().clone() if self.error is not None else None}

    def load_state(self, group: Mapping[str, Any] | None, mine: Mapping[str, Any] | None) -> None:
        """Resume from a checkpoint's ``group_state`` (any rank's: they are equal) and this rank's
        ``rank_state`` (None after a reshard, or from a checkpoint written without one: zero error)."""
        if group:
            self.iter = int(group.get("iter", 0))
            self.scale = float(group.get("scale", self.scale))
            self._clean_steps = int(group.get("clean_steps", 0))
            q = group.get("q")
            if q is not None and [list(x) for x in self.matrices] == [list(x) for x in group.get("layout", [])]:
                self.q = [t.to(self.comm, torch.float32) for t in q]
            elif q is not None:
                log.warning("the checkpoint's PowerSGD factors are for another layout (trainer.powersgd_rank or "
                            "the model changed): Q starts again from its seeded draw")
        e = (mine or {}).get("error")
        if e is not None and int(mine.get("world", 0)) == self.world and e.numel() == self.numel:
            self.error = e.to(self.comm, torch.float32)
        elif e is not None:
            log.warning("rank %d: the checkpoint's PowerSGD error feedback is for %s ranks and %d parameters, this "
                        "group has %d and %d: it starts at zero", self.rank, mine.get("world"), e.numel(),
                        self.world, self.numel)
            self.error = None
        else:
            self.error = None
