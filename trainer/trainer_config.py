"""``[trainer]``: the device, batches, schedule, checkpoints, snapshots, metrics and group settings of the
trainer."""

from __future__ import annotations

from dataclasses import dataclass

from streamrec.foundation.config import InvalidValue, check_choice

from .trainer_types import Compression, DenseOptimizer, GroupBatch, HotSource, Precision, Schedule

_RANGES = (  # key, lowest, highest (None: no bound), the error's message
    ("batch_size", 1, None, "must be >= 1"),
    ("ranks", 1, 4096, "must be in 1..4096"),
    ("max_restarts", 0, None, "must be >= 0"),
    ("group_timeout_s", 5, 86_400, "must be in 5..86400 seconds"),
    ("max_events", 0, None, "must be >= 0 (0 = run forever)"),
    ("idle_exit_s", 0, None, "must be >= 0 (0 = never)"),
    ("window_batches", 1, None, "must be >= 1"),
    ("hot_wait_batches", 1, None, "must be >= 1 (a hot batch needs batch_size arrivals to fill)"),
    ("merge_wait_ms", 0, None, "must be >= 0 (0 = no merge)"),
    ("merge_max_events", 1, None, "must be >= 1"),
    ("metrics_port", 0, 65535, "must be in 0..65535 (0 = off)"),
)


@dataclass
class TrainerConfig:
    device: str = "auto"  # where the trainer computes and keeps hot rows: auto (cuda if present, else cpu) | cpu | cuda | cuda:N
    torch_threads: int = 0  # CPU threads for torch ops (0 = torch's default: all cores)
    batch_size: int = 256  # events per training mini-batch (the default's progressive AUC against other sizes: BENCHMARKS.md, quality)
    dense_optimizer: DenseOptimizer = "adam"  # optimizer of the dense (MLP) parameters: adam | adagrad
    dense_lr: float = 3e-3  # learning rate of the dense (MLP) parameters (the default against other rates: BENCHMARKS.md, quality)
    schedule: Schedule = "fae"  # mini-batch order: fae (hot mini-batches apart from cold ones, FAE) | arrival (arrival order, hot and cold mixed)
    hot_per_cold: int = 0  # trainer groups' per-window FAE plans: hot per cold mini-batch, 0 = in proportion (one trainer interleaves by arrival)
    checkpoint_dir: str = "data/checkpoints"  # where durable checkpoints go; offsets are committed only after one
    checkpoint_every_events: int = 500_000  # checkpoint after this many events ...
    checkpoint_every_s: float = 10.0  # ... or after this many seconds, whichever comes first (bounds what a crash re-trains)
    keep_checkpoints: int = 3  # complete checkpoints kept on disk
    snapshot_every: int = 1  # 0 = build no snapshots; with serving.push_every_s = 0, push one after every N checkpoints
    full_snapshot_every: int = 600  # every N-th snapshot is full, the rest deltas (with serving.push_every_s = 1: a full one every 10 minutes)
    metrics_window: int = 20_000  # events in the sliding AUC/logloss window
    metrics_port: int = 0  # Prometheus HTTP port of the trainer, 0 = off
    metrics_host: str = "127.0.0.1"  # address the Prometheus endpoint binds (0.0.0.0 to publish it, as in containers)
    log_path: str = ""  # JSON-lines metrics log ("" = none)
    max_events: int = 0  # stop after this many events (0 = run forever)
    idle_exit_s: float = 0.0  # stop after this long without events while no fetch shows records left to read (0 = never)
    ranks: int = 1  # trainer ranks that train one model together (streamrec train --nproc N on one host)
    exchange_precision: Precision = "fp32"  # trainer groups: rows and row gradients on the wire, fp32 | bf16 | fp16 (owners keep fp32; bf16 halves the sparse bytes)
    dense_allreduce_precision: Precision = "fp32"  # trainer groups: the dense gradients' all-reduce, fp32 | bf16 | fp16 (fp16 with a dynamic scale, fp32 again on overflow)
    dense_allreduce_compression: Compression = "none"  # trainer groups: none (the exact sum) | powersgd (low-rank P Q^T of each large weight gradient with error feedback, torch's powerSGD_hook; biases and small layers summed as they are)
    powersgd_rank: int = 4  # dense_allreduce_compression=powersgd: the approximation's rank (1-4 typical; bytes grow with it)
    powersgd_start_iter: int = 100  # dense_allreduce_compression=powersgd: applied dense steps summed uncompressed first (torch's start_powerSGD_iter)
    group_batch: GroupBatch = "group"  # trainer groups: what batch_size counts, group (one group step trains batch_size events, batch_size // N per rank: the model one trainer trains) | rank (each rank trains batch_size per step: the global batch is N x batch_size, less CPU per event; learning rates unchanged, see README "Scaling out")
    max_restarts: int = 1000  # times a group restarts from its last checkpoint after a rank dies (torchrun)
    group_timeout_s: float = 300.0  # a trainer group's collectives and rendezvous store give up on a silent rank after this long (a cut link); the group then restarts from its last checkpoint
    window_batches: int = 8  # an event waits at most batch_size * window_batches arrivals for its hot/cold mini-batch to fill; also the poll size
    hot_wait_batches: float = 2.5  # FAE: a hot event waits at most batch_size * hot_wait_batches arrivals for a full hot mini-batch, else trains with the cold ones in arrival order (>= window_batches: every hot event waits for the hot batch, which may train partial)
    merge_wait_ms: float = 200.0  # ms after which a partition that delivered nothing no longer holds back the merge of partitions by event time (0 = no merge, partition after partition)
    merge_max_events: int = 200_000  # ... and an event waiting in the merge is trained anyway once this many events arrived after it (bounds memory)
    hot_source: HotSource = "topic"  # where the hot set comes from: topic (follow the sketch's hot-set topic) | sample (count in-process) | none (no hot set)
    hot_sample_events: int = 50_000  # hot_source=sample: events counted before choosing the hot set
    hot_refresh_events: int = 0  # hot_source=sample: re-count every N events (0 = choose once)
    log_every_s: float = 2.0  # seconds between metrics-log records / progress updates
    snapshot_dir: str = "data/snapshots"  # where serving snapshots are built before the push
    push_snapshots: bool = True  # push snapshots to serving.push_targets / serving.target when one is set (false, or neither set: only build them)
    until_end: bool = False  # stop at the end of the stream as it was at start (a finite replay), after a final checkpoint
    push_give_up_s: float = 120.0  # a replica still missing a snapshot after this long is left behind (others move on; it gets a full one when back)
    trace_path: str = ""  # JSON-lines debug file of trained Kafka offset ranges ("" = none)
    fake_negative_correction: bool = True  # join.mode = fake_negative streams: weigh positives (1 + f) and fake negatives (1 - f)(1 + f), f = the model's own detached probability (Ktena et al. 2019); false = the naive loss
    delayed_max_held: int = 1_000_000  # fake_negative streams: progressive scores held for a possible positive (one per impression, until the longest join task window + join.allowed_lateness_s of event time pass); past this, the oldest are counted as negatives

    def __post_init__(self) -> None:
        for key, allowed in (("dense_optimizer", DenseOptimizer), ("schedule", Schedule),
                             ("exchange_precision", Precision), ("dense_allreduce_precision", Precision),
                             ("dense_allreduce_compression", Compression), ("group_batch", GroupBatch),
                             ("hot_source", HotSource)):
            check_choice("trainer", self, key, allowed)
        if self.push_give_up_s <= 0:
            raise InvalidValue("push_give_up_s", "must be > 0", "trainer")
        for key, low, high, message in _RANGES:
            value = getattr(self, key)
            if not (value >= low and (high is None or value <= high)):
                raise InvalidValue(key, message, "trainer")
        if not 1 <= self.powersgd_rank <= 64:
            raise InvalidValue("powersgd_rank", "must be in 1..64 (the rank of each compressed gradient's "
                                                f"approximation), got {self.powersgd_rank!r}", "trainer")
        if self.powersgd_start_iter < 0:
            raise InvalidValue("powersgd_start_iter", "must be >= 0 (0 = compress from the first step), got "
                                                      f"{self.powersgd_start_iter!r}", "trainer")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise InvalidValue("device", f"must be auto, cpu or cuda[:N], got {self.device!r}", "trainer")
        if not self.metrics_host.strip():
            raise InvalidValue("metrics_host", "must be an address (127.0.0.1 keeps the endpoint on this machine)",
                               "trainer")
