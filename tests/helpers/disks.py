"""Real small file systems for the resource-error tests: a tmpfs of a given size, filled on demand.

CI runs as root and must run these tests: there a tmpfs that cannot be mounted fails the test;
elsewhere it skips with the reason printed (-rs)."""

from __future__ import annotations

import contextlib
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
    """Fill ``mnt`` up to ``leave`` free bytes with one file; returns it (unlink it: space is back)."""
    filler = mnt / "filler"
    st = os.statvfs(mnt)
    with open(filler, "ab") as f:
        try:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
        except OSError:  # tmpfs rounds to pages: the last page may not fit
            pass
    return filler
