"""The continuous trainer: DLRM over the tiered embedding store, FAE hot/cold
mini-batches, progressive validation, checkpoints + offsets, serving snapshots."""

from .core import TrainerCore, WindowResult
from .hotset import HotUpdate, SampleHotSource, TopicHotSource, budget_rows, make_hot_source
from .metrics import StreamingMetrics
from .model import DLRM, embed_batch, pool_sum, predict_batch
from .schedule import MiniBatch, hot_samples, plan
from .step import dense_optimizer, resolve_device, train_step

__all__ = [
    "DLRM", "embed_batch", "pool_sum", "predict_batch",
    "TrainerCore", "WindowResult", "StreamingMetrics", "MiniBatch", "hot_samples", "plan",
    "HotUpdate", "SampleHotSource", "TopicHotSource", "budget_rows", "make_hot_source",
    "dense_optimizer", "resolve_device", "train_step",
]
