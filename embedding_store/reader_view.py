"""A private view of a RocksDB shard for a read-only open that writes nothing into the shard.

rocksdict rewrites its ``rocksdict-config.json`` on every open, a read-only open included. Opened in place,
a checkpoint's shard would change under another process reading it at the same moment: a trainer rank
verifying the checkpoint's checksums saw the file half-written and set a sound checkpoint aside as corrupt,
and a second opener could read it half-written. A read-only open therefore goes through a view: a
directory beside the store that hard-links the shard's files (RocksDB never rewrites a file it wrote, and a
read-only open writes none of them) and holds its own copy of the rocksdict config. A file that cannot be
linked (another filesystem, no permission) is copied. The shard's own files are only read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# rewritten by every open; copied into the view, never linked
_OWN_COPY = ("rocksdict-config.json",)
# written by RocksDB itself on open (its info log and lock): a view makes its own
_LEFT_OUT_PREFIXES = ("LOG", "LOCK")


def open_view(shard: Path, views: Path) -> Path:
    """A new directory under ``views`` (created; the system's temporary directory where ``views`` cannot be)
    that shows ``shard``'s files to a read-only open."""
    try:
        views.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only mount of the store: the links fail too, so the view copies
        views = Path(tempfile.gettempdir()) / "streamrec-readers"
        views.mkdir(parents=True, exist_ok=True)
    view = Path(tempfile.mkdtemp(prefix=f"{shard.name}-{os.getpid()}-", dir=views))
    try:
        for src in shard.iterdir():
            if not src.is_file() or src.name.startswith(_LEFT_OUT_PREFIXES):
                continue
            dst = view / src.name
            if src.name in _OWN_COPY:
                shutil.copyfile(src, dst)
                continue
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise
    return view


def close_views(made: list[Path]) -> None:
    """Remove the views in ``made``, then the directory holding them once it is empty."""
    for view in made:
        shutil.rmtree(view, ignore_errors=True)
        try:
            view.parent.rmdir()
        except OSError:  # another reader's views are still there, or it is gone already
            pass
