"""What a server reads from the configuration, as one typed value: ``ServerSettings``.

A server needs its own section (``[serving]``), the store settings each version opens its own RocksDB copy
with (``[store]``: shards, block cache, and the initial-vector scale a manifest that names none falls back
to), and ingest's bound on dense values, so that serving refuses exactly what training dead-letters. The
application picks these out of the whole configuration once; everything below it takes this value or the
section it reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streamrec.embedding_store.store_config import StoreConfig
from streamrec.serving.serving_config import ServingConfig


@dataclass(frozen=True)
class ServerSettings:
    """The sections one server process reads. The sections are shared, not copied: a test that changes
    ``settings.serving.refusal_delay_ms`` on a running server changes what its refusals read."""

    serving: ServingConfig
    store: StoreConfig
    dense_abs_max: float  # ingest.dense_abs_max: the largest absolute dense value a request may carry

    def with_serving(self, **changes) -> "ServerSettings":
        """These settings with ``changes`` applied to a copy of the serving section (a model line's own
        directory, a group process's own port); the other sections stay shared."""
        return dataclasses.replace(self, serving=dataclasses.replace(self.serving, **changes))
