"""A served version scores with a frozen trace of its model only when that trace gives the eager scores bit for bit."""

from __future__ import annotations

import torch

from streamrec.app.config import load_config
from streamrec.model import DLRM
from streamrec.serving.version import scoring_forward


def test_frozen_forward_scores_exactly_as_the_eager_model():
    cfg = load_config(None, {}, env={})
    model = DLRM.from_config(cfg.model).eval()
    fwd = scoring_forward(model, cfg.model, torch.device("cpu"))
    assert fwd is not model and isinstance(fwd, torch.jit.ScriptModule)
    g = torch.Generator().manual_seed(7)
    for b in (1, 37, 512, 513):  # sizes the probe never saw
        dense = torch.randn(b, cfg.model.dense_dim, generator=g)
        pooled = torch.randn(b, len(cfg.model.fields), cfg.model.embedding_dim, generator=g)
        with torch.inference_mode():
            assert torch.equal(fwd(dense, pooled), model(dense, pooled)), b


def test_a_model_that_cannot_be_traced_is_scored_eager():
    cfg = load_config(None, {}, env={})

    class Odd(DLRM):
        def forward(self, dense, pooled):  # data-dependent Python: a trace would bake in one branch
            if float(dense.sum()) > 1e30:
                raise RuntimeError("never")
            return {"logits": super().forward(dense, pooled)}  # a dict output: not traceable as is

    model = Odd.from_config(cfg.model).eval()
    assert scoring_forward(model, cfg.model, torch.device("cpu")) is model
