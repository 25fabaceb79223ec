"""The errors that stop the sketch worker as one line: the operator's to fix, not a crash."""

from __future__ import annotations

import os

from streamrec.foundation import StreamrecError, is_resource_error


def is_fatal_line(exc: BaseException) -> bool:
    """An error the operator fixes and the worker reports as one line, not a crash: a full, read-only or
    unwritable state directory, out of file handles (:func:`streamrec.foundation.is_resource_error`), or a
    streamrec error that says what to do (a recreated topic under ``kafka.on_offsets_lost=fail``)."""
    return is_resource_error(exc) or isinstance(exc, StreamrecError)


def naming_path(e: BaseException, path: str) -> BaseException:
    """``e``, or for an OSError that names no file (a failed write or close says only its errno) the same
    error naming ``path``, so its one line says where the disk is full."""
    if isinstance(e, OSError) and e.errno and not e.filename:
        named = OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
        named.__cause__ = e
        return named
    return e
