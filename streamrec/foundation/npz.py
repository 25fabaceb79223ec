"""``.npz`` archives keyed by user-chosen names (tables, fields)."""

from __future__ import annotations

import zipfile

import numpy as np


def save_npz(path, arrays: dict) -> None:
    """``np.savez(path, **arrays)`` for any key: savez took a key named ``file`` as its path
    argument (TypeError) and ``allow_pickle`` as a flag (not saved). Same archive layout,
    read back with ``np.load``."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)
