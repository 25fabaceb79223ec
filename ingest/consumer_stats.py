"""What an ``EventConsumer`` and its parts count: one plain record, shared by all of them, read by metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConsumerStats:
    records: int = 0
    events: int = 0
    bytes: int = 0
    dead_letters: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0  # records dead-lettered because a process died handling them (crash-loop breaker)
    commit_failures: int = 0  # commits refused (rebalance, coordinator moved); retried at the next one
    rebalances: int = 0  # partition assignments after the first
    offsets_reset: int = 0  # partitions moved by kafka.on_offsets_lost (earliest/latest)
    partitions_added: int = 0  # partitions the topic gained while this consumer ran (assign mode reads them too)
