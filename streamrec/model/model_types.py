"""The model extension point: what the trainer, its checkpoints and snapshots, and serving
need of a ranking model.

A model holds only dense parameters. Embedding rows live in the tiered store and reach
the model already looked up and sum-pooled per field (``embed_batch``)::

    dense   [B, dense_dim]       float32 ──┐
                                           ├──► model(dense, pooled) ──► logits [B, T]
    pooled  [B, pooled_dim]      float32 ──┘

``pooled`` is every field's sum-pooled embedding concatenated in ``model.fields`` order: field
``f`` occupies ``model.field_dims[f]`` columns (its table's row width), like TorchRec's
``KeyedTensor.values()``; ``pooled_dim`` is their sum. Fields that share a table are looked up
in it once per step and pool from the same rows. ``T = len(model.tasks)``: column ``t`` is the
logit of task ``model.task_names[t]``. A model with one task may return ``[B]`` instead;
``task_logits(out, T)`` makes it ``[B, 1]`` and refuses any other shape.

Everything outside ``streamrec.model`` builds a model with ``build_model(model_cfg)`` and
then uses only what :class:`RankingModel` names: the forward call, ``parameters()`` for
the dense optimizer and the group's all-reduce, ``state_dict``/``load_state_dict`` for
checkpoints and snapshots (safetensors of the state dict), ``train``/``eval`` and ``to``.
The same module scores for the trainer and for serving, so a served score equals the
trainer's score for the same weights.

``Architecture``, the values ``model.architecture`` may take, is defined with ``[model]`` in
``streamrec.foundation.model_config`` (the schema every layer reads) and named here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, runtime_checkable

from streamrec.foundation.model_config import Architecture

if TYPE_CHECKING:
    import torch

__all__ = ["Architecture", "ModelBuilder", "RankingModel"]


@runtime_checkable
class RankingModel(Protocol):
    """A dense network over pooled embeddings: one logit per event and task."""

    def __call__(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T]`` (``[B]`` accepted when ``T == 1``) from ``dense [B, dense_dim]`` and
        ``pooled [B, pooled_dim]``."""
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
