"""File checksums: sha256 in 1 MiB blocks, the one digest snapshots, pushes and
served versions record for their files."""

from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20


def sha256_file(path: "str | os.PathLike", block: int = BLOCK) -> str:
    """Hex sha256 of a file's bytes, read in ``block``-sized pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
