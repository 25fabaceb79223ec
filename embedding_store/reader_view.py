"""A private view of a store directory, for a read-only open that must write nothing into the store.

rocksdict rewrites its ``rocksdict-config.json`` on every open, a read-only open included. A checkpoint's
store opened in place by one process changes under another reading it at the same moment: the ranks of a
trainer group resharding one checkpoint each open every rank's shard while the others verify the
checkpoint's checksums, and a rank that read the file half-written set a sound checkpoint aside as corrupt.
:func:`store_view` gives such a reader a directory of its own that hard-links the store's files (RocksDB
never rewrites a file it wrote, and a read-only open writes none of them) and holds its own copy of each
rocksdict config; a file that cannot be linked (another filesystem, no permission) is copied. The store's
own files are only read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# rewritten by every open: copied into the view, never linked
_OWN_COPY = ("rocksdict-config.json",)
# RocksDB's info log and lock file: written by whoever opens the directory, so a view starts without them
_LEFT_OUT_PREFIXES = ("LOG", "LOCK")


def store_view(store_dir: str | Path, under: str | Path) -> Path:
    """A new directory under ``under`` (created; put it on the store's filesystem so that its files link)
    showing ``store_dir``'s files and subdirectories; remove it with :func:`remove_view` after closing."""
    src_root = Path(store_dir)
    Path(under).mkdir(parents=True, exist_ok=True)
    view = Path(tempfile.mkdtemp(prefix=f".view-{src_root.name}-{os.getpid()}-", dir=under))
    try:
        for d, _dirs, files in os.walk(src_root):
            rel = Path(d).relative_to(src_root)
            (view / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                if name.startswith(_LEFT_OUT_PREFIXES):
                    continue
                src, dst = Path(d) / name, view / rel / name
                if name in _OWN_COPY:
                    shutil.copyfile(src, dst)
                    continue
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copyfile(src, dst)
    except BaseException:
        remove_view(view)
        raise
    return view


def remove_view(view: Path) -> None:
    """Remove a view made by :func:`store_view` (the store it shows is untouched)."""
    shutil.rmtree(view, ignore_errors=True)
