"""Device choice, once for every process: ``auto`` is CUDA when present, else CPU.

The trainer, the embedding store and serving all take a device name from the
config (``trainer.device``) or a caller; asking for CUDA on a machine without it
is an error at start-up, not a crash at the first tensor.
"""

from __future__ import annotations

import torch

from .errors import StreamrecError


class DeviceError(StreamrecError, RuntimeError):
    """The requested device does not exist on this machine."""


def resolve_device(name: "str | torch.device | None" = "auto") -> torch.device:
    """``None``/``"auto"`` -> ``cuda`` when available, else ``cpu``; ``cuda[:N]`` only where CUDA is present."""
    if isinstance(name, torch.device):
        name = str(name)
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"device {name!r} was asked for but CUDA is not available on this machine")
    return torch.device(name)
