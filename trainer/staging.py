"""A step's host arrays on the device in one copy.

On a CUDA device every array a step needs (ids, offsets, positions, cold rows, dense
features, labels) is packed into one pinned host buffer and copied with one non-blocking
transfer; the step then reads typed views of the device copy. A copy per array would cost
a transfer set-up each (dozens per step) and, from pageable memory, a wait for each.
On a CPU there is nothing to copy: the arrays are used where they are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

_ALIGN = 8  # every array starts at a multiple of 8 bytes, so an int64 or float32 view is aligned


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """Each array's byte offset in the packed buffer, and the buffer's size."""
    at, offs = 0, []
    for a in arrays:
        offs.append(at)
        at += -(-a.nbytes // _ALIGN) * _ALIGN
    return offs, at


def pack(arrays: Sequence[np.ndarray], buf: np.ndarray) -> list[int]:
    """Copy ``arrays`` into the uint8 ``buf`` (large enough: see :func:`layout`); their byte offsets."""
    offs, _ = layout(arrays)
    for a, o in zip(arrays, offs):
        buf[o:o + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    return offs


def unpack(dev: torch.Tensor, arrays: Sequence[np.ndarray], offs: Sequence[int]) -> list[torch.Tensor]:
    """Views of the packed device buffer ``dev`` shaped and typed as ``arrays``."""
    out = []
    for a, o in zip(arrays, offs):
        t = dev[o:o + a.nbytes].view(_TORCH[a.dtype.str[1:]])
        out.append(t.reshape(a.shape))
    return out


_TORCH = {"i8": torch.int64, "f4": torch.float32, "i4": torch.int32, "b1": torch.bool, "u1": torch.uint8}


class Stager:
    """Moves a step's arrays to ``device``: as they are on a CPU, in one packed copy elsewhere."""

    def __init__(self, device: torch.device, packed: bool | None = None):
        self.device = device
        self.packed = device.type != "cpu" if packed is None else packed
        self._buf: torch.Tensor | None = None  # reused: each step's copy is waited for before the next packs

    def to_device(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        if not self.packed:
            return [torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays]
        _, size = layout(arrays)
        if self._buf is None or self._buf.numel() < size:
            buf = torch.empty(max(size, 1 << 16) * 2, dtype=torch.uint8)
            self._buf = buf.pin_memory() if torch.cuda.is_available() else buf
        offs = pack(arrays, self._buf.numpy())
        dev = self._buf[:size].to(self.device, non_blocking=True)
        return unpack(dev, arrays, offs)
