"""The values the ingest layer's ``kafka.*`` config keys may take, as ``typing.Literal`` aliases.

The modules that act on a value (the producer, the consumer, the client settings) check it
against ``typing.get_args`` of its alias here; ``streamrec.foundation.config`` annotates its
fields with the same aliases and validates them at load time. This module imports only the
standard library: it is the one piece of ingest the foundation may import (an
``ignore_imports`` entry in pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

from typing import Literal

Codec = Literal["arrow", "json"]
"""``kafka.codec``: the wire form a producer writes (an Arrow IPC stream of many events, or one JSON object)."""

ConsumerMode = Literal["group", "assign"]
"""``kafka.consumer_mode``: join the consumer group, or take every partition without a join."""

OffsetsLostPolicy = Literal["fail", "earliest", "latest"]
"""``kafka.on_offsets_lost``: what a consumer does when the log no longer holds its resume position."""

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
"""``kafka.security_protocol``: how every Kafka client connects (Kafka's own protocol names)."""

SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
"""``kafka.sasl_mechanism``: the SASL mechanism of the ``SASL_*`` protocols."""
