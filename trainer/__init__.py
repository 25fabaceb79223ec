"""The continuous trainer: DLRM over the tiered embedding store."""

from .model import DLRM, embed_batch, pool_sum, predict_batch

__all__ = ["DLRM", "embed_batch", "pool_sum", "predict_batch"]
