"""One clear line for the errors a full, read-only or exhausted machine raises.

Disk full, a read-only or unwritable data directory and too many open files reach
the CLI from many layers: Python's ``OSError`` (with an errno and a path),
RocksDB's ``IO error: ...`` text, torch's ``file write failed``. Each becomes one
line naming the path and what to do. Nothing is lost by stopping: every process
writes its state atomically (checkpoints, snapshots, sketch snapshots) and resumes
from the last complete one, re-reading Kafka from its offsets.
"""

from __future__ import annotations

import errno
import re

# errno -> (what happened, what to do)
_KINDS = {
    errno.ENOSPC: ("no space left on the device", "free space there or point the data directory at a bigger disk"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or raise the quota"),
    errno.EROFS: ("the file system is read-only", "remount it read-write or point the data directory elsewhere"),
    errno.EACCES: ("permission denied", "give this user write access or point the data directory elsewhere"),
    errno.EPERM: ("operation not permitted", "give this user write access or point the data directory elsewhere"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n, LimitNOFILE=) or use fewer store "
                                          "shards (store.shards)"),
    errno.ENFILE: ("the system's open-file table is full", "raise fs.file-max or stop other processes"),
}
# the same conditions as text (RocksDB, torch and others that do not keep the errno)
_TEXT = [
    (re.compile(r"No space left on device", re.I), errno.ENOSPC),
    (re.compile(r"file write failed|unexpected pos .* vs", re.I), errno.ENOSPC),  # torch.save on a full disk
    (re.compile(r"Disk quota exceeded", re.I), errno.EDQUOT),
    (re.compile(r"Read-only file system", re.I), errno.EROFS),
    (re.compile(r"Too many open files", re.I), errno.EMFILE),
    (re.compile(r"Permission denied", re.I), errno.EACCES),
]
_PATH = re.compile(r"(/[^\s:'\"]+)")


def is_resource_error(exc: BaseException) -> bool:
    """The machine, not the data, is at fault (disk full, read-only, no file handles): never treat such an
    error as a corrupt file to set aside or a bad record to dead-letter."""
    return resource_error_line(exc) is not None


def resource_error_line(exc: BaseException) -> str | None:
    """``"<what happened> at <path>: <what to do>; ..."`` for a resource error in ``exc`` or its causes, else None."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code, path = getattr(e, "errno", None), getattr(e, "filename", None)
        if code not in _KINDS:
            code = next((c for pat, c in _TEXT if pat.search(str(e))), None)
        if code in _KINDS:
            if not path:
                m = _PATH.search(str(e))
                path = m.group(1) if m else None
            what, todo = _KINDS[code]
            where = f" at {path}" if path else ""
            return (f"{what}{where}: {todo}. Nothing is lost: restart once it is fixed and the process resumes "
                    f"from its last complete checkpoint")
        e = e.__cause__ or e.__context__
    return None
