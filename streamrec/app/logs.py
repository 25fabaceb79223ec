"""How every ``streamrec`` process logs: text for people, JSON lines for log shippers.

One place sets up logging (level, format, the third-party loggers' levels) and
writes the start-up line, so that every process (broker, sketch, train, serve,
produce, demo) says in the same words what it is, what it read its config from,
and what it is connected to: the first thing an on-call engineer looks for.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

# libraries that log a lot at INFO; they follow --log-level only when it asks for more than WARNING is
NOISY = ("kafka", "aiokafka", "faust", "mode")
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``msg``, extra ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class SlowTaskFilter(logging.Filter):
    """kafka-python's network thread warns when one step of a task took over 0.1 s of wall time ("It is
    blocking the event loop"). In our processes that step mostly waits for the GIL, held by our own
    encoding or training threads, so it fired on every busy run with nothing wrong. A step over
    ``keep_above_s`` is still reported: that would be a real stall."""

    _ELAPSED = re.compile(r"ran for ([0-9.]+)s")

    def __init__(self, keep_above_s: float = 1.0):
        super().__init__()
        self.keep_above_s = keep_above_s

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or "blocking the event loop" not in str(record.msg):
            return True
        m = self._ELAPSED.search(record.getMessage())
        return m is None or float(m.group(1)) > self.keep_above_s


class ClosedTransportFilter(logging.Filter):
    """kafka-python's network thread can read or write a connection that the caller's thread closes that same
    instant (a client closed at a process's stop): the transport's socket is gone (None) by then, and the
    thread logs the AttributeError with its traceback at ERROR. That is the close, not a fault of the
    connection: the record is kept at DEBUG, so it shows only where the ``kafka`` loggers log at DEBUG. Any
    other error of the transport is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, AttributeError) and "'NoneType' object has no attribute" in str(exc)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def one_line_resource_error(record: logging.LogRecord):
    """Rewrite a record at ERROR or above whose exception is the machine's (disk full, read-only, no
    permission, no file handles: :func:`streamrec.foundation.resource_error_line`) as one line, its message
    and that line, with no traceback. Returns the exception info it took off (None when it left the record
    as it was)."""
    exc = record.exc_info[1] if record.levelno >= logging.ERROR and record.exc_info else None
    if exc is None:
        return None
    from streamrec.foundation import resource_error_line

    line = resource_error_line(exc)
    if line is None:
        return None
    exc_info = record.exc_info
    record.msg, record.args = f"{record.getMessage()}: {line}", None
    record.exc_info, record.exc_text = None, None
    return exc_info


class StderrHandler(logging.StreamHandler):
    """Every process's log handler: a resource error logged with its traceback at ERROR (``log.exception``)
    is written as one line (:func:`one_line_resource_error`) and its traceback follows at DEBUG, so an
    operator's alerting sees a full disk, never a crash, whichever part of a process logged it."""

    def handle(self, record: logging.LogRecord) -> bool:
        exc_info = one_line_resource_error(record)
        handled = super().handle(record)
        logger = logging.getLogger(record.name)
        if exc_info is not None and logger.isEnabledFor(logging.DEBUG):
            logger.debug("the traceback of the error above", exc_info=exc_info)
        return handled


_format = {"value": "text"}


def say(msg: str, logger: str = "streamrec") -> None:
    """A line for the person at the terminal (stderr); with JSON logs a JSON record instead, so that a log
    shipper can parse every line."""
    if _format["value"] == "json":
        logging.getLogger(logger).log(logging.WARNING if "WARNING:" in msg else logging.INFO, msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Root handler on stderr in ``fmt``; an unknown level name is refused (a typo silently meant INFO)."""
    _format["value"] = fmt
    lvl = logging.getLevelName(str(level).upper())
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level {level!r}: use one of debug, info, warning, error")
    handler = StderrHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, lvl))
    selector = logging.getLogger("kafka.net.selector")
    if not any(isinstance(f, SlowTaskFilter) for f in selector.filters):
        selector.addFilter(SlowTaskFilter())
    transport = logging.getLogger("kafka.net.transport")
    if not any(isinstance(f, ClosedTransportFilter) for f in transport.filters):
        transport.addFilter(ClosedTransportFilter())


def set_library_level(level: str, names: tuple[str, ...] = NOISY) -> None:
    """Give ``names`` their own level (``sketch --faust-log-level info``), whatever the root's is."""
    lvl = logging.getLevelName(str(level).upper())
    if not isinstance(lvl, int):
        raise ValueError(f"log level {level!r}: use one of debug, info, warning, error")
    for name in names:
        logging.getLogger(name).setLevel(lvl)
    root = logging.getLogger()
    if root.level > lvl:  # the root handler must let them through; our own loggers keep the old level
        streamrec_level = root.level
        root.setLevel(lvl)
        logging.getLogger("streamrec").setLevel(streamrec_level)


def config_source(args) -> str:
    """Where the config came from: the file, then env and ``--set`` (what ``load_config`` layers)."""
    import os

    parts = [getattr(args, "config", None) or "built-in defaults"]
    env = sorted(k for k in os.environ if k.startswith("STREAMREC_") and "__" in k)
    if env:
        parts.append(f"{len(env)} env var{'s' if len(env) > 1 else ''}")
    if getattr(args, "overrides", None):
        parts.append(f"{len(args.overrides)} --set")
    if getattr(args, "data_dir", None):
        parts.append(f"--data-dir {args.data_dir}")
    return " + ".join(parts)


def startup_line(process: str, args, **facts: Any) -> dict[str, Any]:
    """Log (and return) the one start-up line: version, config source and ``facts`` (brokers, topics,
    ports, device, data dir, ...). A fact that is None is left out."""
    import streamrec

    info = {"process": process, "version": streamrec.__version__, "config": config_source(args)}
    info.update({k: v for k, v in facts.items() if v is not None and v != ""})
    text = " · ".join(f"{k} {v}" for k, v in info.items() if k not in ("process", "version"))
    logging.getLogger(f"streamrec.{process}").info("streamrec %s %s starting: %s", streamrec.__version__, process,
                                                   text, extra={"fields": {"event": "start", **info}})
    return info


class IntervalLog:
    """Log a progress line at most every ``interval_s``: what a process shows when no one watches a TTY."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self.log = logger
        self.interval_s = interval_s
        self._last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def maybe(self, msg: str, *args, force: bool = False, fields: dict | None = None) -> bool:
        if not force and not self.due():
            return False
        self._last = time.monotonic()
        self.log.info(msg, *args, extra={"fields": fields or {}})
        return True
