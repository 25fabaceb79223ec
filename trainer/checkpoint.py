"""Atomic checkpoint directories.

A checkpoint is built in a hidden temporary directory (store checkpoint, dense
weights + optimizer state, ``state.json`` with Kafka offsets, hot-set version and
metrics), fsynced, then renamed to ``ckpt-<seq>``: a directory with that name is
complete by construction, so after a crash the newest one is always usable.
Offsets are committed to Kafka only after the rename.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

STATE = "state.json"
DENSE = "dense.pt"
STORE = "store"
_NAME = re.compile(r"^ckpt-(\d{9})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / STATE).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    cks = list_checkpoints(root)
    return cks[-1][1] if cks else None


def write_checkpoint(root: str | os.PathLike, seq: int, state: dict[str, Any], dense: dict[str, Any],
                     write_store: Callable[[Path], Any], keep: int = 3) -> Path:
    """Write ``ckpt-<seq>`` atomically; ``write_store(dir)`` writes the store's own checkpoint into ``dir``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"ckpt-{seq:09d}"
    tmp = root / f".tmp-ckpt-{seq:09d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    store_info = write_store(tmp / STORE)
    torch.save(dense, tmp / DENSE)
    state = dict(state, seq=seq, store=store_info)
    with open(tmp / STATE, "w") as f:
        json.dump(state, f, indent=1, default=_json_default)
    _fsync_tree(tmp)
    if final.exists():  # a leftover from a run that died after rename but before pruning
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    prune(root, keep)
    return final


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints; remove older ones and stale temporaries."""
    cks = list_checkpoints(root)
    for _seq, p in cks[: max(0, len(cks) - max(1, keep))]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-ckpt-*"):
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def read_checkpoint(path: str | os.PathLike, map_location: str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    path = Path(path)
    with open(path / STATE) as f:
        state = json.load(f)
    dense = torch.load(path / DENSE, map_location=map_location, weights_only=False)
    return state, dense


def offsets_to_json(offsets: dict[tuple[str, int], int]) -> list[list]:
    return [[t, p, o] for (t, p), o in sorted(offsets.items())]


def offsets_from_json(rows: list[list]) -> dict[tuple[str, int], int]:
    return {(str(t), int(p)): int(o) for t, p, o in rows}


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
