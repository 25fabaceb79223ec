"""The model both the trainer and serving run: DLRM (bottom MLP, embedding lookup,
pairwise dot interaction, top MLP) and the batch-to-tensor glue around it."""

from .dlrm import DLRM, embed_batch, mlp, pool_sum, predict_batch, unique_ids

__all__ = ["DLRM", "embed_batch", "mlp", "pool_sum", "predict_batch", "unique_ids"]
