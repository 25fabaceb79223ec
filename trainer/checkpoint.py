"""Atomic, checksummed checkpoint directories.

A checkpoint is built in a hidden temporary directory (store checkpoint, dense
weights + optimizer state, ``state.json`` with Kafka offsets, hot-set version and
metrics), its files' sizes and sha256 recorded in ``checksums.json``, fsynced,
then renamed to ``ckpt-<seq>``: a directory with that name is complete by
construction. Offsets are committed to Kafka only after the rename.

A complete directory can still rot on disk (a flipped bit in an SST, a truncated
log): :func:`verify_checkpoint` re-reads every file against ``checksums.json``
and names the first that differs, and :func:`choose_checkpoint` falls back to the
newest checkpoint that verifies, setting corrupt ones aside as ``corrupt-ckpt-<seq>``.
A full, read-only or unwritable disk (or no file handle left) is never taken for a
corrupt checkpoint: writing and verifying raise :class:`~streamrec.foundation.ResourceError`
naming the checkpoint and the path, and nothing is set aside.
Store SSTs are immutable and hard-linked from one checkpoint to the next, so
their digests are cached by inode: each checkpoint hashes only its new files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from streamrec.foundation import StreamrecError, as_resource_error, resource_step, sha256_file

log = logging.getLogger(__name__)

STATE = "state.json"
DENSE = "dense.pt"
STORE = "store"
CHECKSUMS = "checksums.json"
INFLIGHT = "inflight.json"  # the consumer's crash-loop marker (streamrec.ingest.inflight), kept beside the checkpoints
_NAME = re.compile(r"^ckpt-(\d{9})$")
_ANY_SEQ = re.compile(r"ckpt-(\d{9})")
_DIGESTS: dict[tuple[int, int, int, int], str] = {}  # (dev, inode, size, mtime_ns) -> sha256 of an unchanged file
_DIGESTS_MAX = 200_000


class CheckpointError(StreamrecError, RuntimeError):
    """A checkpoint directory does not match its checksums (or cannot be read); the message names the file."""


def _digest(path: Path) -> tuple[int, str]:
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        if len(_DIGESTS) > _DIGESTS_MAX:
            _DIGESTS.clear()
        digest = _DIGESTS[key] = sha256_file(path)
    return st.st_size, digest


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name != CHECKSUMS)


def record_checksums(root: Path) -> None:
    """Write ``checksums.json``: size and sha256 of every file under ``root``."""
    sums = {str(p.relative_to(root)): list(_digest(p)) for p in _files(root)}
    with open(root / CHECKSUMS, "w") as f:
        json.dump(sums, f, indent=0, sort_keys=True)


def verify_checkpoint(path: str | os.PathLike) -> bool:
    """Re-read every file of a checkpoint against its ``checksums.json``. True when verified, False for a
    checkpoint without a ``checksums.json`` (nothing to verify against); raises :class:`CheckpointError` naming the first bad file."""
    path = Path(path)
    try:
        with open(path / CHECKSUMS) as f:
            sums = json.load(f)
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as e:
        err = as_resource_error(e, f"verifying checkpoint {path.name}", str(path / CHECKSUMS))
        if err is not None:
            raise err from e
        raise CheckpointError(f"{path / CHECKSUMS}: unreadable ({e})") from None
    for rel, (size, digest) in sorted(sums.items()):
        p = path / rel
        try:
            if p.stat().st_size != size:
                raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the checkpoint recorded {size} (truncated or "
                                      f"overwritten)")
            if sha256_file(p) != digest:  # never the cache: the point is to read the bytes again
                raise CheckpointError(f"{p}: sha256 does not match the checkpoint's (corrupt on disk)")
        except OSError as e:
            err = as_resource_error(e, f"verifying checkpoint {path.name}", str(p))
            if err is not None:  # no file handle, no permission: the machine's fault, not a corrupt checkpoint
                raise err from e
            raise CheckpointError(f"{p}: cannot be read ({e.strerror or e})") from None
    return True


def choose_checkpoint(root: str | os.PathLike, verify=verify_checkpoint) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and one line per newer one set aside as corrupt."""
    refused = []
    for seq, p in reversed(list_checkpoints(root)):
        try:
            verify(p)
            return p, refused
        except CheckpointError as e:
            refused.append(str(e))
            set_aside(p, str(e))
    return None, refused


def set_aside(path: Path, why: str) -> Path:
    """Rename a checkpoint that cannot be used to ``corrupt-ckpt-<seq>`` (kept for inspection, never chosen)."""
    dest = path.with_name("corrupt-" + path.name)
    n = 1
    while dest.exists():
        dest, n = path.with_name(f"corrupt-{n}-" + path.name), n + 1
    with resource_step(f"setting checkpoint {path.name} aside", path):
        os.rename(path, dest)
    log.error("checkpoint %s refused: %s; moved to %s, falling back to the previous one", path.name, why, dest.name)
    return dest


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


def highest_seq(root: str | os.PathLike) -> int:
    """The highest checkpoint number in use under ``root`` (0 for none): complete checkpoints, those set aside
    (``corrupt-ckpt-*``), unfinished temporaries and a group's shard checkpoints (``rank-*/ckpt-*``). A run
    that restores no checkpoint numbers its own after it: :func:`prune` keeps the highest numbers, so a new
    checkpoint numbered below the ones kept beside it would be removed as the oldest as soon as written."""
    root = Path(root)
    if not root.is_dir():
        return 0
    names = [p.name for p in root.iterdir()]
    names += [p.name for d in root.glob("rank-*") if d.is_dir() for p in d.iterdir()]
    return max((int(m.group(1)) for n in names if (m := _ANY_SEQ.search(n))), default=0)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    cks = list_checkpoints(root)
    return cks[-1][1] if cks else None


def write_checkpoint(root: str | os.PathLike, seq: int, state: dict[str, Any], dense: dict[str, Any],
                     write_store: Callable[[Path], Any], keep: int = 3) -> Path:
    """Write ``ckpt-<seq>`` atomically; ``write_store(dir)`` writes the store's own checkpoint into ``dir``."""
    root = Path(root)
    final = root / f"ckpt-{seq:09d}"
    tmp = root / f".tmp-ckpt-{seq:09d}-{os.getpid()}"
    with resource_step(f"writing checkpoint {seq}", root):
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    try:
        store_info = write_store(tmp / STORE)
        torch.save(dense, tmp / DENSE)
        state = dict(state, seq=seq, store=store_info)
        with open(tmp / STATE, "w") as f:
            json.dump(state, f, indent=1, default=_json_default)
        record_checksums(tmp)
        _fsync_tree(tmp)
    except BaseException as e:  # e.g. a full disk: the half-written directory must not keep the space
        shutil.rmtree(tmp, ignore_errors=True)
        # the machine's fault (disk full, read-only, no file handles): one line naming the checkpoint and the path
        err = as_resource_error(e, f"writing checkpoint {seq}", str(tmp)) if isinstance(e, Exception) else None
        if err is not None:
            raise err from e
        if isinstance(e, Exception) and not isinstance(e, StreamrecError):  # say where (torch's errors do not)
            raise CheckpointError(f"writing checkpoint {final} failed: {type(e).__name__}: {e}") from e
        raise
    with resource_step(f"writing checkpoint {seq}", final):
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
