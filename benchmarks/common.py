"""What several benches share: the ``--device`` option and timers that wait for the device."""

from __future__ import annotations

import argparse

DEVICE_HELP = ("where the measured set-ups run: cpu (default), auto (cuda when present), cuda or cuda:N; "
               "the JSON output names the resolved device")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """``--device`` (default ``cpu``: the figures stay comparable across machines unless asked otherwise)."""
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)


def bench_device(name: str, p: argparse.ArgumentParser | None = None):
    """``name`` resolved by the foundation's ``resolve_device``; a device this machine lacks is a usage error."""
    from streamrec.foundation import DeviceError, resolve_device

    try:
        return resolve_device(name)
    except (DeviceError, RuntimeError) as e:
        if p is None:
            raise
        p.error(str(e))


def sync(device) -> None:
    """Wait for the device's queued work, so a timer read after it counts that work (no-op off CUDA)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
