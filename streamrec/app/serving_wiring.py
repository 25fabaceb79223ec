"""The serving side's wiring: what a server and its clients take from the whole configuration.

Only the application sees the whole ``Config``; it picks the sections a server reads here, once, and hands
the server, the clients and the pushers their typed parts.
"""

from __future__ import annotations

from streamrec.app.config import Config
from streamrec.serving import ServerSettings


def server_settings(cfg: Config) -> ServerSettings:
    """The sections a server reads: ``[serving]``, ``[store]`` (its versions' stores) and
    ``ingest.dense_abs_max`` (requests are held to what training accepts)."""
    return ServerSettings(cfg.serving, cfg.store, float(cfg.ingest.dense_abs_max))
