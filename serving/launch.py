"""``serve(cfg)``: start the serving endpoint the config asks for, one process or a group.

It sits above both ``server.py`` (one process) and ``group.py`` (several, each running
a ``ServingServer``), so neither of those imports the other back.
"""

from __future__ import annotations

import torch

from streamrec.app.config import Config

from .group import ServingGroup
from .server import ServingServer


def serve(cfg: Config, device: torch.device | str | None = None, port: int | None = None,
          insecure_push: bool = False) -> ServingServer | ServingGroup:
    """Start a server for ``cfg.serving`` and return its handle (already listening): a ``ServingServer``, or a
    ``ServingGroup`` (``group.py``) of ``serving.processes`` processes when that is above 1.

    Raises ``ConfigError`` when the push endpoint would be open to the network (see
    ``server.push_exposure``) unless ``insecure_push``."""
    if cfg.serving.processes > 1:
        return ServingGroup(cfg, device, port, insecure_push=insecure_push).start()
    server = ServingServer(cfg, device, port, insecure_push=insecure_push)
    if cfg.serving.torch_threads > 0:
        torch.set_num_threads(cfg.serving.torch_threads)
    return server.start()
