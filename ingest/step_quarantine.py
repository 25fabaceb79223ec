"""The consumer's side of the crash-loop breaker (:mod:`streamrec.ingest.inflight`).

:class:`CrashLoopBreaker` keeps the in-flight marker current while a consumer decodes records, hands them
to its caller and runs training steps on them, and, when a start finds that the previous process died,
decides what happens to the records it held: probed in a child process and the ones that kill it
quarantined to the dead-letter topic (a death decoding, or the first death in a training step when the
trainer gave a probe), quarantined with everything in flight with them (a second death), or retried once
(a first death elsewhere). Every record the previous process held is either quarantined with a reason or
handed out again; none is skipped silently.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import TYPE_CHECKING, Callable

import numpy as np

from streamrec.foundation import EventBatch, EventSchema

from .fast_records import RecordRun
from .inflight import DECODE, STEP, InflightMarker, InflightRange, exact_runs, holds_any, probe_decode, ranges_of

if TYPE_CHECKING:
    from .dead_letters import DeadLetterWriter
    from .consumer_stats import ConsumerStats

log = logging.getLogger(__name__)

STEP_CRASH_REASON = ("crashed the trainer: the process died in a training step holding this record, and so did "
                     "a probe training it alone")


def describe_ranges(ranges) -> str:
    """``topic[partition]@first..last`` for each range, comma-separated (for log lines)."""
    return ", ".join(f"{r.topic}[{r.partition}]@{r.first}" + (f"..{r.last}" if r.last != r.first else "")
                     for r in ranges)


class CrashLoopBreaker:
    """The marker at ``path`` (None: no marker, nothing is tracked) and the suspects a dead predecessor
    left in it. Quarantined records go to ``dead_letters`` and are counted in ``stats.quarantined``."""

    def __init__(self, path: str | os.PathLike | None, schema: EventSchema, topic: str, stats: "ConsumerStats",
                 dead_letters: "DeadLetterWriter"):
        self.schema = schema
        self.topic = topic
        self.stats = stats
        self.dead_letters = dead_letters
        self.marker = InflightMarker(path) if path else None
        # (phase, ranges, deaths before) the previous process died holding; None once all were handled
        self.suspect: tuple[str, list[InflightRange], int] | None = self.marker.found if self.marker else None
        # a training step's records (kept after ``suspect`` is cleared: a step holding them again counts deaths)
        self.step_suspect = self.suspect if self.suspect is not None and self.suspect[0] == STEP else None
        # the trainer's probe of a training step (``STEP`` suspects, first death): record values -> the indices
        # of those that kill a process training them alone; None: no probe, the first death only counts
        self.step_probe: Callable[[list[bytes]], list[int]] | None = None
        if self.suspect is not None:
            phase, ranges, deaths = self.suspect
            doing = {DECODE: "decoding", STEP: "running a training step on"}.get(phase, "training on")
            log.error("the previous consumer process died while %s records %s (deaths so far: %d); they are %s",
                      doing, describe_ranges(ranges), deaths + 1,
                      "quarantined to the DLQ" if deaths >= 1 else
                      "probed in a child process" if phase in (DECODE, STEP) else
                      "retried once, quarantined if it dies again")

    # -- records as a consumer reads them ---------------------------------------------

    def mark(self, phase: str, runs: list) -> None:
        """Name these runs in the marker as in flight in ``phase``, with the deaths already seen holding them."""
        if self.marker is not None and runs:
            self.marker.mark(phase, ranges_of(runs), self.deaths_of(runs, phase))

    def quarantine(self, runs: list) -> list:
        """Dead-letter the records a dead predecessor could not get past; return the others (as runs).
        Rare (after a crash), so record by record."""
        if self.suspect is None or not any(
                x.topic == r.topic and x.partition == r.partition and x.first <= r.last_offset and r.offset <= x.last
                for r in runs for x in self.suspect[1]):
            return runs
        kept = self._quarantine_records([rec for r in runs for rec in r.records()])
        return [RecordRun.of_records(list(g)) for _, g in itertools.groupby(kept, lambda r: (r.topic, r.partition))]

    def _quarantine_records(self, recs: list) -> list:
        phase, ranges, deaths = self.suspect
        suspects = [r for r in recs if any(x.holds(r.topic, r.partition, r.offset) for x in ranges)]
        if not suspects:
            return recs
        if phase == DECODE and deaths == 0:
            culprits = {id(suspects[i]) for i in probe_decode(self.schema, [r.value or b"" for r in suspects])}
            why = "crashed the consumer: the process died decoding this record, and so did a probe"
        elif phase == STEP and deaths == 0:
            if self.step_probe is None:
                return recs
            culprits = {id(suspects[i]) for i in self.step_probe([r.value or b"" for r in suspects])}
            why = STEP_CRASH_REASON
        elif deaths >= 1:  # died twice with these in flight (a crash the probe could not reproduce, or training)
            culprits = {id(r) for r in suspects}
            what = "in training steps" if phase == STEP else "training batches"
            why = (f"crashed the {'trainer' if phase == STEP else 'consumer'}: {deaths + 1} processes died {what} "
                   f"holding this record (quarantined with the {len(suspects)} records in flight with it)")
        else:
            return recs  # first death in training: retried once (kept in the marker as a suspect)
        for r in suspects:
            if id(r) in culprits:
                self.stats.quarantined += 1
                self.dead_letters.write(r, why)
        return [r for r in recs if id(r) not in culprits]

    def maybe_clear(self, positions: dict[tuple[str, int], int]) -> None:
        """Back to normal once every suspect record was handled (probed, quarantined or retried):
        ``positions`` (partition -> the offset after the last record handed out) are past them all."""
        if self.suspect is not None and all(positions.get((x.topic, x.partition), -1) > x.last
                                            for x in self.suspect[1]):
            self.suspect = None

    def deaths_of(self, runs: list, phase: str) -> int:
        """Deaths already seen with any of these records (runs) in flight in ``phase`` (0 when none is a suspect)."""
        if self.suspect is None or self.suspect[0] != phase:
            return 0
        _, ranges, deaths = self.suspect
        if not any(x.holds(run.topic, run.partition, r.offset) for run in runs for r in run for x in ranges):
            return 0
        return deaths + 1

    # -- training steps ----------------------------------------------------------------

    def suspect_step(self) -> tuple[list, int] | None:
        """``(ranges, deaths before)`` when the previous process died in a training step, else None."""
        s = self.step_suspect
        return (list(s[1]), s[2]) if s is not None else None

    def mark_step(self, partitions: np.ndarray, records: np.ndarray) -> None:
        """Name exactly a training step's records in the marker (per event: partition and record offset;
        offset -1: not from Kafka, nothing to name), with the deaths already seen holding any of them."""
        if self.marker is None:
            return
        p, o = np.asarray(partitions), np.asarray(records)
        known = o >= 0
        if not known.all():
            p, o = p[known], o[known]
        deaths = 0
        s = self.step_suspect
        if s is not None and holds_any(s[1], self.topic, p, o).any():
            deaths = s[2] + 1
        self.marker.mark_runs(STEP, self.topic, exact_runs(p, o), deaths)

    def step_done(self) -> None:
        """No training step runs now: a death from here on is not blamed on the last step's records."""
        if self.marker is not None:
            self.marker.idle()

    def quarantine_events(self, batch: EventBatch, partitions: np.ndarray, records: np.ndarray, reason: str) -> None:
        """Dead-letter decoded events whose records crashed the trainer but will not be read again, one JSON
        event per message naming its record (``topic:partition:offset``); each record counts once."""
        seen = set()
        for ev, p, o in zip(batch.to_events(), np.asarray(partitions).tolist(), np.asarray(records).tolist()):
            if (p, o) not in seen:
                seen.add((p, o))
                self.stats.quarantined += 1
            self.dead_letters.write_event(ev, self.topic, p, o, reason)

    def close(self) -> None:
        """A clean stop: nothing is in flight, the marker goes."""
        if self.marker is not None:
            self.marker.clear()
