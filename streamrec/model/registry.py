"""``build_model(model_cfg)``: the one place a model is built, for the trainer and for serving.

``model.module = "pkg.mod:build"`` names a user's :class:`ModelBuilder`; it replaces
``model.architecture``. Otherwise ``model.architecture`` picks a built-in. A user's builder runs with
torch's global RNG seeded from ``model.seed`` (and restored afterwards), so a builder that only
constructs layers is deterministic in the seed as the built-ins are. What it returns is checked
before anyone trains it: a :class:`RankingModel` whose forward gives one logit per event and task on a
probe batch of the configured shape (dense ``[2, dense_dim]``, pooled ``[2, pooled_dim]``; logits
``(2, tasks)``, or ``(2,)`` with one task); anything else is a :class:`ConfigError` of one line naming
``model.module``.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from streamrec.foundation import ConfigError

from .dcn_v2 import DCNv2
from .deepfm import DeepFM
from .dlrm import DLRM
from .mlp_model import MLPRanker
from .model_types import ModelBuilder, RankingModel

BUILTINS: dict[str, Callable[..., RankingModel]] = {
    "dlrm": DLRM.from_config,
    "dcn_v2": DCNv2.from_config,
    "deepfm": DeepFM.from_config,
    "mlp": MLPRanker.from_config,
}


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def load_builder(path: str) -> ModelBuilder:
    """The callable ``"pkg.mod:name"`` names; a one-line :class:`ConfigError` when it cannot be had."""
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name.strip() or not attr.strip():
        raise ConfigError(f"model.module: {path!r} is not an import path of the form 'package.module:builder'")
    try:
        mod = importlib.import_module(mod_name.strip())
    except Exception as e:  # ImportError, or whatever the module raises while it loads
        raise ConfigError(f"model.module: cannot import {mod_name.strip()!r} ({_line(e)})") from None
    obj = mod
    for part in attr.strip().split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model.module: module {mod_name.strip()!r} has no attribute {attr.strip()!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"model.module: {path!r} is a {type(obj).__name__}, not a callable builder")
    return obj


def _check_user_model(model, model_cfg, path: str) -> RankingModel:
    if not isinstance(model, torch.nn.Module) or not isinstance(model, RankingModel):
        raise ConfigError(f"model.module: {path!r} returned a {type(model).__name__}, not a torch.nn.Module "
                          "ranking model")
    dense = torch.zeros(2, model_cfg.dense_dim)
    pooled = torch.zeros(2, model_cfg.pooled_dim)
    tasks = len(model_cfg.tasks)
    was_training = model.training
    model.eval()  # a probe must not move batch-norm statistics
    try:
        with torch.no_grad():
            out = model(dense, pooled)
    except Exception as e:
        raise ConfigError(f"model.module: the model of {path!r} fails on a probe batch (dense [2, "
                          f"{model_cfg.dense_dim}], pooled [2, {model_cfg.pooled_dim}]): {_line(e)}") from None
    finally:
        model.train(was_training)
    ok = (2, tasks) if tasks != 1 else (2, 1)
    if not isinstance(out, torch.Tensor) or (tuple(out.shape) != ok and not (tasks == 1 and tuple(out.shape) == (2,))):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        want = f"shape (2, {tasks})" if tasks != 1 else "shape (2, 1) or (2,)"
        raise ConfigError(f"model.module: the model of {path!r} returns {got} for a batch of 2 (dense [2, "
                          f"{model_cfg.dense_dim}], pooled [2, {model_cfg.pooled_dim}]), expected one logit per "
                          f"event and task ({', '.join(model_cfg.task_names)}): {want}")
    return model


def build_model(model_cfg) -> RankingModel:
    """The dense network the ``[model]`` section describes (a :class:`RankingModel`)."""
    if model_cfg.module:
        builder = load_builder(model_cfg.module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model_cfg.seed)
            try:
                model = builder(model_cfg)
            except ConfigError:
                raise
            except Exception as e:
                raise ConfigError(f"model.module: {model_cfg.module!r} raised while building the model "
                                  f"({_line(e)})") from None
        return _check_user_model(model, model_cfg, model_cfg.module)
    try:
        make = BUILTINS[model_cfg.architecture]
    except KeyError:
        raise ConfigError(f"model.architecture: must be one of {', '.join(BUILTINS)}, "
                          f"got {model_cfg.architecture!r}") from None
    return make(model_cfg)
