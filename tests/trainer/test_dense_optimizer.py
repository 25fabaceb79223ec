"""The trainer's dense optimizers step exactly as the ``torch.optim`` classes they stand for, exchange state dicts
with them both ways, refuse a state dict of another shape, and never import torch's compiler."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import get_args

import pytest
import torch

from streamrec.trainer import DenseAdagrad, DenseAdam, DenseOptimizer, dense_optimizer
from streamrec.trainer.dense_optimizers import DENSE_OPTIMIZERS

TORCH = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))


def _steps(net, opt, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(16, 6, generator=g)
        opt.zero_grad(set_to_none=True)
        net(x).pow(2).mean().backward()
        opt.step()


def test_every_configurable_optimizer_has_a_class():
    assert set(DENSE_OPTIMIZERS) == set(get_args(DenseOptimizer))
    with pytest.raises(ValueError, match="dense optimizer must be one of adam, adagrad, got 'sgd'"):
        dense_optimizer(_net(), "sgd", 0.1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_steps_equal_torch_optim_bit_for_bit(kind):
    ours, theirs = _net(), _net()
    opt_ours, opt_theirs = dense_optimizer(ours, kind, 0.01), TORCH[kind](theirs.parameters(), lr=0.01)
    _steps(ours, opt_ours, 7)
    _steps(theirs, opt_theirs, 7)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_state_dicts_load_both_ways_and_training_goes_on_the_same(kind):
    ref = _net()
    opt_ref = TORCH[kind](ref.parameters(), lr=0.01)
    _steps(ref, opt_ref, 4)
    mid_model, mid_opt = ref.state_dict(), opt_ref.state_dict()

    ours = _net(5)  # other weights: the state dicts bring everything
    ours.load_state_dict(mid_model)
    opt_ours = dense_optimizer(ours, kind, 0.5)
    opt_ours.load_state_dict(mid_opt)  # torch.optim's layout into ours
    assert opt_ours.state_dict()["param_groups"][0]["lr"] == 0.01
    _steps(ours, opt_ours, 3, seed=2)
    _steps(ref, opt_ref, 3, seed=2)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)

    back = _net(6)  # ours into torch.optim's
    back.load_state_dict(ours.state_dict())
    opt_back = TORCH[kind](back.parameters(), lr=0.5)
    opt_back.load_state_dict(copy.deepcopy(opt_ours.state_dict()))  # as a checkpoint file holds it
    _steps(back, opt_back, 2, seed=3)
    _steps(ours, opt_ours, 2, seed=3)
    for a, b in zip(ours.parameters(), back.parameters()):
        assert torch.equal(a, b)


def test_a_state_dict_of_another_shape_is_refused_and_changes_nothing():
    opt = DenseAdam(_net().parameters(), 0.01)
    other = DenseAdam(torch.nn.Linear(3, 1).parameters(), 0.01)
    with pytest.raises(ValueError, match="cannot load into one group of 4 parameters"):
        opt.load_state_dict(other.state_dict())
    assert opt.state == {}
    net = _net()
    ada = DenseAdagrad(net.parameters(), 0.01)
    _steps(net, ada, 1)
    broken = ada.state_dict()
    del broken["state"][0]["sum"]
    with pytest.raises(ValueError, match=r"parameter 0 lacks \['sum'\]"):
        DenseAdagrad(_net().parameters(), 0.01).load_state_dict(broken)


def test_zero_grad_keeps_or_drops_gradients_and_a_step_without_any_changes_nothing():
    net = _net()
    opt = DenseAdam(net.parameters(), 0.01)
    before = [p.detach().clone() for p in net.parameters()]
    opt.step()  # no gradient yet
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters())) and opt.state == {}
    net(torch.ones(2, 6)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.subprocess
def test_a_training_process_never_imports_the_compiler():
    code = ("import sys, torch\n"
            "from streamrec.trainer.dense_optimizers import dense_optimizer\n"
            "for kind in ('adam', 'adagrad'):\n"
            "    net = torch.nn.Linear(4, 1); opt = dense_optimizer(net, kind, 0.1)\n"
            "    net(torch.ones(2, 4)).sum().backward(); opt.step(); opt.load_state_dict(opt.state_dict())\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
