"""The dense parameters' optimizers: torch's Adam and Adagrad updates, kept without ``torch.optim``'s classes.

Every ``torch.optim.Optimizer`` imports the compiler stack (``torch._dynamo``) when it is built and on each step,
a large part of a process's start; a trainer restarted after a crash would pay it before its first step.
:class:`DenseAdam` and :class:`DenseAdagrad` call torch's functional updates
(``torch.optim.adam.adam``, ``torch.optim.adagrad.adagrad``) with the classes' defaults and the same choice of
single-tensor or foreach kernels, so a step changes the parameters exactly as ``torch.optim.Adam(params, lr=lr)``
or ``torch.optim.Adagrad(params, lr=lr)`` would, and never imports the compiler.

Their ``state_dict`` has the classes' layout (``state`` keyed by parameter index, one ``param_groups`` entry
naming the indices), so a checkpoint written by either loads into the other.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.optim.adagrad import adagrad
from torch.optim.adam import adam

from .trainer_types import DenseOptimizer


class DenseOptimizerProtocol(Protocol):
    """What the trainer asks of the dense parameters' optimizer (``torch.optim.Optimizer`` satisfies it)."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...
    def step(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class _FunctionalOptimizer:
    """One parameter group and per-parameter state, stepped by a functional update."""

    DEFAULTS: dict[str, Any] = {}
    STATE_KEYS: tuple[str, ...] = ()

    def __init__(self, params, lr: float) -> None:
        self.params: list[torch.Tensor] = list(params)
        if not self.params:
            raise ValueError("the optimizer got no parameters")
        self.group: dict[str, Any] = {"lr": float(lr), **self.DEFAULTS}
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter with a gradient; a parameter's state is created at its first."""
        params, states = [], []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} takes dense gradients; parameter {i} has a sparse one")
            st = self.state.get(i)
            if st is None:
                st = self.state[i] = self._new_state(p)
            params.append(p)
            states.append(st)
        if params:
            self._update(params, [p.grad for p in params], states)

    def _new_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _update(self, params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"state": {i: dict(st) for i, st in self.state.items()},
                "param_groups": [{**self.group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a copy of a state dict of this class or of the ``torch.optim`` class it stands for.

        Raises ``ValueError`` where the dict holds other than one group over this optimizer's parameters."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            sizes = [len(g["params"]) for g in groups]
            raise ValueError(f"optimizer state for parameter groups of sizes {sizes} cannot load into one group "
                             f"of {len(self.params)} parameters")
        position = {pid: i for i, pid in enumerate(groups[0]["params"])}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for pid, st in state_dict["state"].items():
            i = position[pid]
            p = self.params[i]
            missing = [k for k in self.STATE_KEYS if k not in st]
            if missing:
                raise ValueError(f"optimizer state of parameter {i} lacks {missing}")
            state[i] = {k: (torch.tensor(float(v), dtype=torch.float32) if k == "step"
                            else v.to(device=p.device, dtype=p.dtype, copy=True)) for k, v in st.items()}
        self.group = {k: v for k, v in groups[0].items() if k != "params"}
        self.state = state


class DenseAdam(_FunctionalOptimizer):
    """``torch.optim.Adam(params, lr=lr)``'s update (betas 0.9/0.999, eps 1e-8, no weight decay)."""

    DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False, "maximize": False,
                "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                "decoupled_weight_decay": False}
    STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")

    def _new_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"step": torch.tensor(0.0, dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p)}

    def _update(self, params, grads, states) -> None:
        g = self.group
        adam(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
             [s["step"] for s in states], foreach=g["foreach"], amsgrad=False, beta1=g["betas"][0],
             beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"], eps=g["eps"], maximize=g["maximize"])


class DenseAdagrad(_FunctionalOptimizer):
    """``torch.optim.Adagrad(params, lr=lr)``'s update (eps 1e-10, no decay, accumulators start at zero)."""

    DEFAULTS = {"lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10,
                "foreach": None, "maximize": False, "differentiable": False, "fused": None}
    STATE_KEYS = ("step", "sum")

    def _new_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"step": torch.tensor(0.0, dtype=torch.float32), "sum": torch.zeros_like(p)}

    def _update(self, params, grads, states) -> None:
        g = self.group
        adagrad(params, grads, [s["sum"] for s in states], [s["step"] for s in states], foreach=g["foreach"],
                lr=g["lr"], weight_decay=g["weight_decay"], lr_decay=g["lr_decay"], eps=g["eps"],
                maximize=g["maximize"])


DENSE_OPTIMIZERS: dict[str, type[_FunctionalOptimizer]] = {"adam": DenseAdam, "adagrad": DenseAdagrad}


def dense_optimizer(model: torch.nn.Module, kind: DenseOptimizer, lr: float) -> DenseOptimizerProtocol:
    """The optimizer ``trainer.dense_optimizer`` names, over every parameter of ``model``."""
    cls = DENSE_OPTIMIZERS.get(kind)
    if cls is None:
        raise ValueError(f"dense optimizer must be one of {', '.join(DENSE_OPTIMIZERS)}, got {kind!r}")
    return cls(model.parameters(), lr)
