"""One clear line for the errors a full, read-only or exhausted machine raises.

Disk full, a read-only or unwritable data directory and too many open files reach
the CLI from many layers: Python's ``OSError`` (with an errno and a path),
pyarrow's ``OSError`` (an errno, no path), RocksDB's ``IO error: ...`` text (rocksdict
keeps no errno), torch's ``file write failed``. Each becomes one line: what failed,
the path, the errno's name and what to do. Nothing is lost by stopping: every
process writes its state atomically (checkpoints, snapshots, sketch snapshots) and
resumes from the last complete one, re-reading Kafka from its offsets.

A writer names what it was doing with :func:`resource_step` (``with
resource_step("writing checkpoint 7", path): ...``): a resource error inside becomes
a :class:`ResourceError` that carries that name and the path, so the one line says
which write failed even when the library's own error names no file.
"""

from __future__ import annotations

import errno
import re
from contextlib import contextmanager
from typing import Iterator

from .errors import StreamrecError

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


class ResourceError(StreamrecError, OSError):
    """A write (or open) failed because of the machine: ``.errno``, ``.filename`` (the path), ``.what``
    (what was being done) and ``.line``, the operator's one line. An ``OSError``, so ``except OSError``
    clauses that handled the original keep handling it."""

    def __init__(self, what: str, code: int, path: str | None):
        super().__init__(code, _KINDS[code][0], path)
        self.what = what

    @property
    def line(self) -> str:
        return _line(self.what, self.errno, self.filename)

    def __str__(self) -> str:
        return self.line

    def __reduce__(self):  # picklable across processes (a trainer group's ranks, serving's siblings)
        return (type(self), (self.what, self.errno, self.filename))


def _classify(exc: BaseException) -> tuple[int, str | None, str | None] | None:
    """``(errno, path, what)`` of the first resource error in ``exc`` or its causes (``what``: the
    outermost :class:`ResourceError`'s, which carries the path of the error it wraps)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ResourceError):
            return e.errno, e.filename, e.what
        code, path = getattr(e, "errno", None), getattr(e, "filename", None)
        if code not in _KINDS:
            code = next((c for pat, c in _TEXT if pat.search(str(e))), None)
        if code in _KINDS:
            if not path:
                m = _PATH.search(str(e))
                path = m.group(1) if m else None
            return code, (str(path) if path else None), None
        e = e.__cause__ or e.__context__
    return None


RESUMES = "Nothing is lost: restart once it is fixed and the process resumes from its last complete checkpoint"


def _line(what: str | None, code: int, path: str | None, then: str = RESUMES) -> str:
    kind, todo = _KINDS[code]
    head = f"{what} failed: " if what else ""
    where = f" at {path}" if path else ""
    return f"{head}{kind} ({errno.errorcode.get(code, code)}){where}: {todo}" + (f". {then}" if then else "")


def is_resource_error(exc: BaseException) -> bool:
    """The machine, not the data, is at fault (disk full, read-only, no file handles): never treat such an
    error as a corrupt file to set aside or a bad record to dead-letter."""
    return _classify(exc) is not None


def resource_error_line(exc: BaseException, then: str = RESUMES) -> str | None:
    """``"<what> failed: <what happened> (<ERRNO>) at <path>: <what to do>. <then>"`` for a resource error
    in ``exc`` or its causes (``<what> failed: `` only when a :func:`resource_step` named it), else None.
    ``then`` says what happens next (by default: a restart resumes from the last checkpoint)."""
    found = _classify(exc)
    return _line(found[2], found[0], found[1], then) if found else None


def as_resource_error(exc: BaseException, what: str, path: str | None = None) -> ResourceError | None:
    """``exc`` as a :class:`ResourceError` naming ``what`` (and ``path`` when the error names none), or None
    when it is no resource error. A :class:`ResourceError` already naming what failed is returned as is."""
    found = _classify(exc)
    if found is None:
        return None
    if isinstance(exc, ResourceError):
        return exc
    code, where, inner_what = found
    return ResourceError(inner_what or what, code, where or (str(path) if path else None))


@contextmanager
def resource_step(what: str, path=None) -> Iterator[None]:
    """Run a write; a resource error inside is raised as a :class:`ResourceError` naming ``what`` and the
    path (the error's own, else ``path``), chained to the original (its traceback stays for DEBUG logs)."""
    try:
        yield
    except ResourceError:
        raise
    except Exception as e:
        err = as_resource_error(e, what, path)
        if err is None:
            raise
        raise err from e
