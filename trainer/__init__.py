"""The continuous trainer: DLRM over the tiered embedding store, FAE hot/cold
mini-batches, progressive validation, checkpoints + offsets, serving snapshots.

Public surface::

    TrainerService(settings, bootstrap, stop=, progress=, pusher_factory=).run() -> summary
    TrainerSettings                     # what a service reads (the app's wiring.trainer_settings(cfg))
    TrainerCore(model, trainer, store, device, store_cfg=, join=, sizes=)  # train one window of events, no Kafka
    BatchSizes, batch_sizes(trainer, world)    # the step, window and hot-wait sizes, derived once per process
    SnapshotPublisher                          # snapshots after checkpoints, pushed in the background
    EvidenceCollector, collector_for           # the quality evidence each snapshot carries (serving's guard reads it)
    ContributionMeter, CONTRIBUTION_EVENTS     # each field's paired AUC contribution, on a bounded sample per window
    StreamingMetrics, MemoryDLRM               # progressive AUC/logloss; the all-in-memory reference
    make_hot_source(trainer, model, kafka, budget, bootstrap), SampleHotSource, TopicHotSource, HotUpdate
    HotSetSource                               # the Protocol a hot-set source satisfies
    plan, hot_samples, MiniBatch               # FAE's hot/cold mini-batch schedule
    train_step                                 # the per-table step (the fused step's reference)
    dense_optimizer, DenseAdam, DenseAdagrad   # torch's dense updates without torch.optim's classes
    DenseOptimizerProtocol                     # what the steps ask of the dense optimizer
    FusedStep, PreparedStep                    # one step for every table: ids resolved on the host, one pass on the device
    RowSource                                  # the Protocol a fused step's row owner satisfies (store, in-memory baseline)
    StageClock                                 # seconds per pipeline stage (bench train --host-ceiling)
    probe_train, probe_records                 # which events (records) kill a process training them alone
    GroupTrainerService(settings, bootstrap, rank, world, ...).run()  # one rank of a group (torchrun)
    ShardedTrainerCore(model, trainer, store, device, rank, world, ...)  # TrainerCore with row-wise sharded rows
    RunLoop, RunTimers                         # the one training loop of a process and of a group's rank
    owner_of, RowExchange, reshard_into                           # who owns a row; the step's traffic; N -> M
    DenseOptimizer, Schedule, Precision, Compression, GroupBatch, HotSource  # trainer.* values (Literal aliases)
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .batch_sizes import BatchSizes, batch_sizes
    from .trainer_config import TrainerConfig
    from .trainer_settings import TrainerSettings
    from .core import TrainerCore, WindowResult
    from .crash_probe import probe_records, probe_train
    from .contribution import CONTRIBUTION_EVENTS, ContributionMeter
    from .evidence import EvidenceCollector, collector_for
    from .fused_step import FusedStep, PreparedStep
    from .group import GroupError, GroupTrainerService
    from .hotset import SampleHotSource, TopicHotSource, make_hot_source, top_rows
    from .hotset_types import HotSetSource, HotUpdate
    from .metrics import StreamingMetrics
    from .reference import MemoryDLRM
    from .schedule import MiniBatch, hot_samples, plan
    from .reshard import reshard_into
    from .run_loop import RunLoop
    from .run_timers import RunTimers
    from .service import TrainerService
    from .sharded_core import ShardedTrainerCore
    from .sharding import RowExchange, owner_of
    from .snapshots import SnapshotPublisher
    from .stage_clock import StageClock
    from .step_types import RowSource
    from .step import train_step
    from .dense_optimizers import DenseAdagrad, DenseAdam, DenseOptimizerProtocol, dense_optimizer
    from .trainer_types import Compression, DenseOptimizer, GroupBatch, HotSource, Precision, Schedule

_EXPORTS = {  # submodule: the public names it defines
    ".batch_sizes": "BatchSizes batch_sizes",
    ".core": "TrainerCore WindowResult",
    ".crash_probe": "probe_records probe_train",
    ".contribution": "CONTRIBUTION_EVENTS ContributionMeter",
    ".evidence": "EvidenceCollector collector_for",
    ".fused_step": "FusedStep PreparedStep",
    ".group": "GroupError GroupTrainerService",
    ".hotset": "SampleHotSource TopicHotSource make_hot_source top_rows",
    ".hotset_types": "HotSetSource HotUpdate",
    ".metrics": "StreamingMetrics",
    ".reference": "MemoryDLRM",
    ".schedule": "MiniBatch hot_samples plan",
    ".reshard": "reshard_into",
    ".run_loop": "RunLoop",
    ".run_timers": "RunTimers",
    ".service": "TrainerService",
    ".trainer_config": "TrainerConfig",
    ".trainer_settings": "TrainerSettings",
    ".sharded_core": "ShardedTrainerCore",
    ".sharding": "RowExchange owner_of",
    ".snapshots": "SnapshotPublisher",
    ".stage_clock": "StageClock",
    ".step_types": "RowSource",
    ".step": "train_step",
    ".dense_optimizers": "DenseAdagrad DenseAdam DenseOptimizerProtocol dense_optimizer",
    ".trainer_types": "Compression DenseOptimizer GroupBatch HotSource Precision Schedule",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
