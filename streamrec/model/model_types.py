"""The model extension point: what the trainer, its checkpoints and snapshots, and serving
need of a ranking model.

A model holds only dense parameters. Embedding rows live in the tiered store and reach
the model already looked up and sum-pooled per field (``embed_batch``)::

    dense   [B, dense_dim]       float32 ──┐
                                           ├──► model(dense, pooled) ──► logits [B]
    pooled  [B, fields, dim]     float32 ──┘

Everything outside ``streamrec.model`` builds a model with ``build_model(model_cfg)`` and
then uses only what :class:`RankingModel` names: the forward call, ``parameters()`` for
the dense optimizer and the group's all-reduce, ``state_dict``/``load_state_dict`` for
checkpoints and snapshots (safetensors of the state dict), ``train``/``eval`` and ``to``.
The same module scores for the trainer and for serving, so a served score equals the
trainer's score for the same weights.

This module imports only the standard library when it runs (torch only for type checkers): it is
the one piece of ``streamrec.model`` the foundation's config imports, for the ``model.architecture``
alias (an ``ignore_imports`` entry in pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

Architecture = Literal["dlrm", "dcn_v2", "deepfm", "mlp"]
"""``model.architecture``: the built-in dense network ``build_model`` makes (``model.module`` names a user's own)."""


@runtime_checkable
class RankingModel(Protocol):
    """A dense network over pooled embeddings: one logit per event."""

    def __call__(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from ``dense [B, dense_dim]`` and ``pooled [B, fields, dim]``."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...


class ModelBuilder(Protocol):
    """Builds a :class:`RankingModel` from the ``[model]`` config section; deterministic in
    ``model_cfg.seed`` so every rank and every restart starts from the same weights."""

    def __call__(self, model_cfg: Any) -> RankingModel: ...
