"""Real small file systems for the resource-error tests: a tmpfs of a given size, filled on demand.

CI runs as root and must run these tests: there a tmpfs that cannot be mounted fails the test;
elsewhere it skips with the reason printed (-rs)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


def mount_tmpfs(mnt: Path, size: str) -> None:
    """Mount a tmpfs of ``size`` (``"4m"``) at ``mnt`` (created), or fail (under CI) / skip the test."""
    give_up = pytest.fail if os.environ.get("CI") else pytest.skip
    if os.geteuid() != 0:
        give_up("mounting a tmpfs needs root; this test environment runs as another user")
    mnt.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        give_up(f"cannot mount a tmpfs here: {res.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """:func:`mount_tmpfs` for the block, unmounted (lazily: a process may still hold a file) after it."""
    mount_tmpfs(mnt, size)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, leave: int = 0) -> Path:
    """Fill ``mnt`` with one file until a write fails for want of space, then give ``leave`` bytes back (rounded
    to the file system's blocks); returns the file (unlink it: all its space is back).

    Filling until the write fails, rather than writing the free space read beforehand, holds while another
    process writes to the same file system: the free space it reads may be gone by the time of the write."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        chunk = b"\0" * (1 << 20)
        while chunk:
            try:
                os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2] if len(chunk) > 512 else b""
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler
