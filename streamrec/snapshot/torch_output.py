"""torch's own output while a model is exported, kept out of the process's log as one DEBUG record.

``torch.export`` talks while it traces: its loggers (``torch.*``, which carry their own stderr handlers and do
not propagate) write symbolic-shape warnings, Python warnings are raised, and on a failure it prints the
partial FX graph to ``sys.stderr``. A caller that turns the outcome into one line of its own wants none of
that in its log. :func:`torch_output_captured` collects all three, from the calling thread only (another
thread's output passes through untouched, so an export on a background thread does not swallow the trainer's
lines), and logs what it collected as one DEBUG record when the block ends.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

_capture_lock = threading.Lock()  # one capture at a time: each swaps process-wide hooks and puts them back


class _ThreadOutput(logging.Filter):
    """Takes the records of torch's loggers made on one thread (kept as text); every other record passes."""

    def __init__(self, thread: int, lines: list[str]):
        super().__init__()
        self.thread, self.lines = thread, lines

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread or record.name.partition(".")[0] != "torch":
            return True
        text = record.getMessage()
        if text.strip():  # torch's structured-trace records carry their payload outside the message
            self.lines.append(f"{record.levelname} {record.name}: {text}")
        return False


class _ThreadStream:
    """``sys.stderr``/``sys.stdout`` as one thread sees them during a capture: its writes are kept, every other
    thread's go to the stream this replaced."""

    def __init__(self, inner: Any, thread: int, lines: list[str]):
        self._inner, self._thread, self._lines = inner, thread, lines

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            if text.strip():
                self._lines.append(text.rstrip("\n"))
            return len(text)
        return self._inner.write(text)

    def flush(self) -> None:
        if threading.get_ident() != self._thread:
            self._inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _torch_handlers() -> set[logging.Handler]:
    """The handlers a record of a ``torch.*`` logger can reach: torch's own and the root's."""
    out = set(logging.getLogger().handlers)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.partition(".")[0] == "torch":
            out.update(logger.handlers)
    return out


@contextmanager
def torch_output_captured(log: logging.Logger, what: str) -> Iterator[list[str]]:
    """Within the block, torch's log records, Python warnings and ``sys.stderr``/``sys.stdout`` writes made
    by this thread are collected; at its end (also when it raises) they go to ``log`` as one DEBUG record
    naming ``what``. Yields the list the lines are collected in."""
    lines: list[str] = []
    me = threading.get_ident()
    with _capture_lock:
        keep = _ThreadOutput(me, lines)
        handlers = _torch_handlers()
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if threading.get_ident() == me:
                lines.append(f"{category.__name__}: {message} ({filename}:{lineno})")
            else:
                shown(message, category, filename, lineno, file, line)

        out, err = sys.stdout, sys.stderr
        for h in handlers:
            h.addFilter(keep)
        warnings.showwarning = show
        mine = _ThreadStream(out, me, lines), _ThreadStream(err, me, lines)
        sys.stdout, sys.stderr = mine
        try:
            yield lines
        finally:
            if sys.stdout is mine[0]:  # put back unless someone replaced it meanwhile
                sys.stdout = out
            if sys.stderr is mine[1]:
                sys.stderr = err
            warnings.showwarning = shown
            for h in handlers:
                h.removeFilter(keep)
            if lines:
                log.debug("torch's own output while %s (%d lines):\n%s", what, len(lines), "\n".join(lines))
