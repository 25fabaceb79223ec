"""``serve(settings)``: start the serving endpoint the config asks for, one process or a group.

It sits above both ``server.py`` (one process) and ``group.py`` (several, each running
a ``ServingServer``), so neither of those imports the other back.
"""

from __future__ import annotations

import torch

from .group import ServingGroup
from .server import ServingServer
from .settings import ServerSettings


def serve(settings: ServerSettings, device: torch.device | str | None = None, port: int | None = None,
          insecure_push: bool = False) -> ServingServer | ServingGroup:
    """Start a server for ``settings.serving`` and return its handle (already listening): a ``ServingServer``, or
    a ``ServingGroup`` (``group.py``) of ``serving.processes`` processes when that is above 1. ``device``:
    where versions score (None: auto).

    Raises ``ConfigError`` when the push endpoint would be open to the network (see
    ``server.push_exposure``) unless ``insecure_push``."""
    s = settings.serving
    if s.processes > 1:
        return ServingGroup(settings, device, port, insecure_push=insecure_push).start()
    server = ServingServer(settings, device, port, insecure_push=insecure_push)
    if s.torch_threads > 0:
        torch.set_num_threads(s.torch_threads)
    return server.start()
