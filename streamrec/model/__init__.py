"""The model both the trainer and serving run, and the batch-to-tensor glue around it.

Public surface::

    RankingModel, ModelBuilder        # the extension point (model_types.py)
    build_model(model_cfg)            # the built-in builder: DLRM (bottom MLP, pooled embeddings,
                                      # pairwise dot interaction, top MLP)
    DLRM, mlp                         # the built-in architecture
    embed_batch, pool_sum, unique_ids, predict_batch   # batch -> tensors -> scores
"""

from .dlrm import DLRM, embed_batch, mlp, pool_sum, predict_batch, unique_ids
from .model_types import ModelBuilder, RankingModel


def build_model(model_cfg) -> RankingModel:
    """The dense network the ``[model]`` section describes (a :class:`RankingModel`)."""
    return DLRM.from_config(model_cfg)


__all__ = ["DLRM", "ModelBuilder", "RankingModel", "build_model", "embed_batch", "mlp", "pool_sum", "predict_batch",
           "unique_ids"]
