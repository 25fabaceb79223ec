"""What the joiner does with one input record, apart from faust and Kafka: parse it, join it, encode the
examples it completes (:class:`Joiner`, over one :class:`~.machine.JoinState` per owned partition)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from streamrec.foundation import EventSchema
from streamrec.joiner.join_config import JoinConfig
from streamrec.ingest import Decoder, encode_arrow, is_arrow

from .key_partitions import partitions_of
from .machine import DueHeaps, JoinRules, JoinState, JoinStats, parse_action
from .txstore import dumps, loads


@dataclass(slots=True)
class Decoded:
    """One input record parsed: an impression (``body``: its event) or an action (``body``: an
    :class:`~.machine.Action`), its event time (None: not an integer, or malformed), its request id; a
    malformed record has ``error`` set and nothing else. An Arrow record of many impressions has ``many``
    set: ``body`` is then its impressions as ``(request_id, ts, event)`` in row order, ``rid`` None and
    ``ts`` the earliest of their times (the merge releases the message before the actions that follow it)."""

    impression: bool
    ts: int | None
    rid: str | None
    body: Any
    error: str | None = None
    many: bool = False


class Joiner:
    """What the join task does with one record, apart from faust: parse, join, encode. ``schema``: the
    labelled events it writes (an impression is checked against it without the label). ``retired``: totals
    of the machines dropped at rebalances (the live ones keep their own)."""

    def __init__(self, join: JoinConfig, schema: EventSchema, metrics=None, partitions: int | None = None):
        self.rules = JoinRules.from_config(join)
        self.impressions_topic = join.impressions_topic
        self.schema_in = dataclasses.replace(schema, require_label=False)  # an impression carries no label
        self.arrow = Decoder(self.schema_in, unlabelled=True)  # Arrow impressions: the events' columns, no label
        self.partitions = partitions  # the input topics' partition count (None: Arrow rows' partitions unchecked)
        self.schema_out = schema
        self.machines: dict[int, JoinState] = {}
        self.retired = JoinStats()
        self.malformed = 0
        self.metrics = metrics

    def add(self, p: int, store, heaps: DueHeaps | None = None) -> JoinState:
        """Partition ``p``'s join over ``store``; ``heaps``: its due-time heaps read ahead (:class:`JoinState`)."""
        on_delay = self.metrics.delay if self.metrics is not None else None
        m = self.machines[p] = JoinState(self.rules, store, on_delay=on_delay, heaps=heaps)
        return m

    def drop(self, p: int) -> None:
        m = self.machines.pop(p, None)
        if m is None:
            return
        for k, v in vars(m.stats).items():
            if k == "examples":
                for kind, n in v.items():
                    self.retired.examples[kind] += n
            elif k != "rows":
                setattr(self.retired, k, getattr(self.retired, k) + v)

    def totals(self) -> JoinStats:
        out = JoinStats(**{k: v for k, v in vars(self.retired).items() if k != "examples"})
        out.examples = dict(self.retired.examples)
        out.rows = 0
        for m in list(self.machines.values()):
            for k, v in vars(m.stats).items():
                if k == "examples":
                    for kind, n in v.items():
                        out.examples[kind] += n
                else:
                    setattr(out, k, getattr(out, k) + v)
        return out

    def handle(self, p: int, topic: str, key: bytes | None, value: bytes | None) -> list:
        """The examples one record completes, as ``(key, event, kind, identity)``; ValueError: the record is
        malformed (the reason)."""
        return self.apply(p, self.decode(topic, key, value))

    def decode(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None) -> Decoded:
        """One record of input partition ``partition`` parsed and checked, not joined yet (its ``ts`` orders
        it, ``error`` says why it is malformed)."""
        try:
            if topic == self.impressions_topic and is_arrow(value):
                try:
                    return self._arrow_impressions(value, partition)
                except ValueError:
                    raise
                except Exception as e:  # one record's failure, whatever it is: a dead letter, never a stop
                    raise ValueError(f"Arrow impressions: {type(e).__name__}: {e}") from None
            try:
                obj = loads(value) if value else None
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"not JSON: {e}") from None
            if obj is None:
                raise ValueError("empty record")
            if topic == self.impressions_topic:
                rid, ts, ev = self._impression(obj)
                self._check_key(key, rid)
                return Decoded(True, ts if type(ts) is int else None, rid, ev)
            action = parse_action(obj)
            self._check_key(key, action.request_id)
            return Decoded(False, action.ts, action.request_id, action)
        except ValueError as e:
            return Decoded(topic == self.impressions_topic, None, None, None, str(e))

    def apply(self, p: int, d: Decoded) -> list:
        """The examples a decoded record completes in partition ``p``, as ``(key, event, kind, identity)``;
        ValueError: the record is malformed (the reason)."""
        if d.error is not None:
            raise ValueError(d.error)
        m = self.machines[p]
        if d.many:
            exs = [ex for rid, ts, ev in d.body for ex in m.impression(rid, ts, ev)]
        else:
            exs = m.impression(d.rid, d.body.get("ts", 0), d.body) if d.impression else m.action(d.body)
        return self._outputs(p, exs)

    def advance(self, p: int, ms: int) -> list:
        """The examples partition ``p``'s event time moved ``ms`` on without a record completes
        (:meth:`~.machine.JoinState.advance`), as :meth:`apply` gives them."""
        return self._outputs(p, self.machines[p].advance(ms))

    def _outputs(self, p: int, exs: list) -> list:
        """Partition ``p``'s examples as ``(key, event, kind, identity)``."""
        out = []
        for ex in exs:
            task = ""
            if ex.kind == "positive" and self.rules.mode == "fake_negative":
                labels = ex.event.get("labels") or {}
                task = next((t for t, y in labels.items() if y == 1), self.rules.task_names[0])
            kind = "example" if self.rules.mode == "window" else ex.kind
            ident = f"{p}|{ex.request_id}|{kind}|{task}"
            out.append((ex.request_id.encode(), ex.event, ex.kind, ident))
        return out

    def _impression(self, obj) -> tuple[str, int, dict]:
        if not isinstance(obj, dict):
            raise ValueError(f"impression must be a JSON object, got {type(obj).__name__}")
        if "label" in obj or "labels" in obj or "feedback" in obj:
            raise ValueError("an impression carries no label or feedback kind (the joiner sets both from its "
                             "actions)")
        rid = obj.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
            raise ValueError("impression: request_id must be a non-empty string or an integer")
        self.schema_in.validate(obj)  # EventError (a ValueError) names the field
        return str(rid), obj.get("ts", 0), obj

    def _arrow_impressions(self, value: bytes, partition: int | None) -> Decoded:
        """An Arrow record of impressions (``encode_arrow(..., labelled=False)``): the events' Arrow columns
        without ``label``, ``labels`` or ``feedback``, every row with a non-empty ``request_id`` that hashes
        to the record's partition (where its actions are); any row failing makes the whole record malformed,
        so a record's impressions are all joined or none. Raises ValueError (EventError) with the reason."""
        batch = self.arrow.decode_arrow(value)
        n = len(batch)
        if not n:
            raise ValueError("Arrow impressions: the record holds no impression")
        rids = batch.request_ids
        bad = 0 if rids is None else next((i for i, r in enumerate(rids) if not r), None)
        if bad is not None:
            raise ValueError(f"impression: request_id must be a non-empty string or an integer (row {bad})")
        if partition is not None and self.partitions:
            qs = partitions_of([rid.encode() for rid in rids], range(self.partitions))
            for i, (rid, q) in enumerate(zip(rids, qs)):  # as a keyed send of request_id: where its actions are
                if q != partition:
                    raise ValueError(f"impression {rid[:64]!r} (row {i}) hashes to partition {q}, not this "
                                     f"record's {partition}: both topics must be partitioned by request_id "
                                     "(co-partitioning)")
        events = batch.to_events(self.schema_in.tasks if batch.task_labels is not None else None)
        body = []
        for rid, ev in zip(rids, events):
            ev.pop("label", None)  # to_events fills the absent labels in; the joiner sets them
            ev.pop("labels", None)
            body.append((rid, ev["ts"], ev))
        return Decoded(True, int(batch.ts.min()), None, body, many=True)

    @staticmethod
    def _check_key(key: bytes | None, rid: str) -> None:
        if key is not None and key != rid.encode():
            raise ValueError(f"record key {key[:64]!r} is not its request_id {rid[:64]!r}: both topics must be "
                             "keyed by request_id (co-partitioning)")

    def encode(self, ev: dict) -> bytes:
        """One event as one JSON message (``kafka.codec = json``)."""
        return dumps(ev)

    def encode_many(self, evs: list[dict]) -> bytes:
        """Events as one Arrow IPC message (``kafka.codec = arrow``)."""
        return encode_arrow(self.schema_out.batch_from_events(evs), self.schema_out)
