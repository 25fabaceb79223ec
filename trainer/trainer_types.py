"""The values the trainer's ``trainer.*`` config keys may take, as ``typing.Literal`` aliases.

The modules that act on a value (the optimizer factory, the scheduler, the row exchange, the
dense all-reduce, the hot-set source) check it against ``typing.get_args`` of its alias here;
``streamrec.foundation.config`` annotates its fields with the same aliases and validates them
at load time. This module imports only the standard library: it is the one piece of the
trainer the foundation may import (an ``ignore_imports`` entry in pyproject.toml's
import-linter contracts).
"""

from __future__ import annotations

from typing import Literal

DenseOptimizer = Literal["adam", "adagrad"]
"""``trainer.dense_optimizer``: the optimizer of the dense (MLP) parameters."""

Schedule = Literal["fae", "arrival"]
"""``trainer.schedule``: FAE's hot and cold mini-batches, or plain arrival order."""

Precision = Literal["fp32", "bf16", "fp16"]
"""``trainer.exchange_precision`` and ``trainer.dense_allreduce_precision``: a trainer group's wire format."""

Compression = Literal["none", "powersgd"]
"""``trainer.dense_allreduce_compression``: the exact sum, or PowerSGD's low-rank approximation."""

GroupBatch = Literal["group", "rank"]
"""``trainer.group_batch``: whether ``trainer.batch_size`` counts a group step's events or one rank's."""

HotSource = Literal["topic", "sample", "none"]
"""``trainer.hot_source``: follow the sketch's hot-set topic, count in-process, or keep no hot set."""
