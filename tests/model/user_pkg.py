"""A user's model package written into ``tmp_path`` and put on ``sys.path`` (removed again after the test)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from contextlib import contextmanager

MODULE = '''
import torch
from torch import nn


class TwoTower(nn.Module):
    """A user's own ranker: dense features and the flattened embeddings through one hidden layer."""

    def __init__(self, fields, dense_dim, dim, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dense_dim + fields * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, dense, pooled):
        return self.net(torch.cat([dense, pooled.flatten(1)], dim=1)).squeeze(1)


def build(model_cfg):
    return TwoTower(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim, 12)


def not_a_model(model_cfg):
    return {"weights": 1}


def wrong_shape(model_cfg):
    return nn.Linear(model_cfg.dense_dim, 2)  # called with (dense, pooled): fails on the probe


class PerEventPair(nn.Module):
    def forward(self, dense, pooled):
        return pooled.sum(dim=1, keepdim=True).repeat(1, 2)  # [B, 2], not [B] (one task)


def two_logits(model_cfg):
    return PerEventPair()


def raises(model_cfg):
    raise RuntimeError("the builder is broken\\non two lines")


class Experts(nn.Module):
    """A mixture of ``experts`` linear experts under a softmax gate over the dense features."""

    def __init__(self, inputs, dense_dim, experts):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(inputs, 1) for _ in range(experts))
        self.gate = nn.Linear(dense_dim, experts)

    def forward(self, dense, pooled):
        x = torch.cat([dense, pooled], dim=1)
        w = torch.softmax(self.gate(dense), dim=1)
        return sum(w[:, i] * e(x).squeeze(1) for i, e in enumerate(self.experts))


def experts(model_cfg):
    """Reads its own setting from [model.params] and refuses a value it cannot use, naming the key."""
    from streamrec.foundation import ConfigError

    n = model_cfg.params["experts"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"model.params.experts: must be an integer >= 1, got {n!r}")
    return Experts(model_cfg.dense_dim + model_cfg.pooled_dim, model_cfg.dense_dim, n)
'''


@contextmanager
def user_package(tmp_path):
    """``(package_name)``: a fresh package ``<name>.ranking`` holding the builders above, importable while open."""
    name = f"userpkg_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / "site" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ranking.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path / "site"))
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
