"""``build_model(model_cfg)``: the one place a model is built, for the trainer and for serving.

``model.module = "pkg.mod:build"`` names a user's :class:`ModelBuilder`; it replaces
``model.architecture``. Otherwise ``model.architecture`` picks a built-in. A user's builder runs with
torch's global RNG seeded from ``model.seed`` (and restored afterwards), so a builder that only
constructs layers is deterministic in the seed as the built-ins are. What it returns is checked
before anyone trains or serves it: a :class:`RankingModel` whose forward gives one logit per event and task
on a probe batch of the configured shape (dense ``[2, dense_dim]``, pooled ``[2, pooled_dim]``, standard
normal from a fixed seed, on the model's own device, so a forward that branches on a value runs as it will
on real events; logits ``(2, tasks)``, or ``(2,)`` with one task); anything else is a
:class:`ModelModuleError` of one line naming ``model.module``, whose ``stage`` says what failed.

``model.params`` (the ``[model.params]`` table) is the builder's own: it reads ``model_cfg.params`` and
refuses a value it cannot use by raising :class:`~streamrec.foundation.ConfigError` naming the key
(``"model.params.experts: must be an integer >= 1, got 0"``), which reaches the user as it is; a key the
builder reads with ``params[key]`` that the table does not set is refused naming that key.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Literal

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


Stage = Literal["import", "build", "probe"]


class ModelModuleError(ConfigError):
    """``model.module`` gives no usable model; ``stage`` says where it failed: ``import`` (the path does not
    import or name a callable), ``build`` (the builder raised or returned no module) or ``probe`` (the
    forward fails on the probe batch or returns another shape)."""

    def __init__(self, message: str, stage: Stage):
        super().__init__(message)
        self.stage = stage


class MissingParam(KeyError):
    """A builder read ``model_cfg.params[key]`` and ``[model.params]`` does not set ``key``."""


class _Params(dict):
    """``model.params`` as a builder sees it: ``params[key]`` of a key the table lacks names the key."""

    def __missing__(self, key):
        raise MissingParam(key)


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def load_builder(path: str) -> ModelBuilder:
    """The callable ``"pkg.mod:name"`` names; a one-line :class:`ModelModuleError` (stage ``import``) when it
    cannot be had."""
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name.strip() or not attr.strip():
        raise ModelModuleError(f"model.module: {path!r} is not an import path of the form "
                               "'package.module:builder'", "import")
    try:
        mod = importlib.import_module(mod_name.strip())
    except Exception as e:  # ImportError, or whatever the module raises while it loads
        raise ModelModuleError(f"model.module: cannot import {mod_name.strip()!r} ({_line(e)})", "import") from None
    obj = mod
    for part in attr.strip().split("."):
        if not hasattr(obj, part):
            raise ModelModuleError(f"model.module: module {mod_name.strip()!r} has no attribute {attr.strip()!r}",
                                   "import")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelModuleError(f"model.module: {path!r} is a {type(obj).__name__}, not a callable builder", "import")
    return obj


def probe_batch(model_cfg, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The check's probe batch: dense ``[2, dense_dim]`` and pooled ``[2, pooled_dim]``, standard normal from a
    fixed seed (torch's global generator untouched), on ``device``."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(2, model_cfg.dense_dim, generator=g)
    pooled = torch.randn(2, model_cfg.pooled_dim, generator=g)
    return dense.to(device), pooled.to(device)


def _check_user_model(model, model_cfg, path: str, probe: bool = True) -> RankingModel:
    if not isinstance(model, torch.nn.Module) or not isinstance(model, RankingModel):
        raise ModelModuleError(f"model.module: {path!r} returned a {type(model).__name__}, not a torch.nn.Module "
                               "ranking model", "build")
    if not probe:
        return model
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), torch.device("cpu"))
    dense, pooled = probe_batch(model_cfg, device)
    shapes = f"dense [2, {model_cfg.dense_dim}], pooled [2, {model_cfg.pooled_dim}]"
    tasks = len(model_cfg.tasks)
    was_training = model.training
    model.eval()  # a probe must not move batch-norm statistics
    try:
        with torch.no_grad():
            out = model(dense, pooled)
    except Exception as e:
        raise ModelModuleError(f"model.module: the model of {path!r} fails on a probe batch ({shapes}, on "
                               f"{device.type}): {_line(e)}", "probe") from None
    finally:
        model.train(was_training)
    ok = (2, tasks) if tasks != 1 else (2, 1)
    if not isinstance(out, torch.Tensor) or (tuple(out.shape) != ok and not (tasks == 1 and tuple(out.shape) == (2,))):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        want = f"shape (2, {tasks})" if tasks != 1 else "shape (2, 1) or (2,)"
        raise ModelModuleError(f"model.module: the model of {path!r} returns {got} for a batch of 2 ({shapes}), "
                               f"expected one logit per event and task ({', '.join(model_cfg.task_names)}): {want}",
                               "probe")
    return model


def _build_user_model(model_cfg):
    builder = load_builder(model_cfg.module)
    seen = dataclasses.replace(model_cfg, params=_Params(model_cfg.params))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_cfg.seed)
        try:
            return builder(seen)
        except ConfigError:
            raise
        except MissingParam as e:
            raise ConfigError(f"model.params.{e.args[0]}: the builder {model_cfg.module!r} reads it, and "
                              "[model.params] does not set it") from None
        except Exception as e:
            raise ModelModuleError(f"model.module: {model_cfg.module!r} raised while building the model "
                                   f"({_line(e)})", "build") from None


def build_model(model_cfg, probe: bool = True) -> RankingModel:
    """The dense network the ``[model]`` section describes (a :class:`RankingModel`). ``probe``: run a user's
    module on the probe batch (module doc); False only builds and type-checks it (e.g. on the ``meta``
    device, where no forward can read a value)."""
    if model_cfg.module:
        return _check_user_model(_build_user_model(model_cfg), model_cfg, model_cfg.module, probe)
    try:
        make = BUILTINS[model_cfg.architecture]
    except KeyError:
        raise ConfigError(f"model.architecture: must be one of {', '.join(BUILTINS)}, "
                          f"got {model_cfg.architecture!r}") from None
    return make(model_cfg)
