"""The ``streamrec`` command line: one entry point, one subcommand per part.

Each group of subcommands lives in a module exposing ``register(subparsers, common)``
(``streamrec.app.commands.*``, the demo, the report, the benchmarks); this module owns
only the shared options (``--config``, ``--set``, ``--bootstrap``, ``--data-dir``, ``--log-level``,
``--log-format``),
the broker choice, and how errors reach the user: a :class:`StreamrecError` (bad
input, bad config, unreachable dependency) is one line on stderr, anything else
keeps its traceback. A command module that fails to import is an error, never a
silently missing subcommand.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from typing import Iterator

import streamrec
from streamrec.foundation import ConfigError, parse_overrides
from streamrec.app.config import Config, load_config
from streamrec.foundation.errors import StreamrecError
from streamrec.foundation.resources import resource_error_line

from .logs import LOG_FORMATS, setup_logging
from .preflight import apply_data_dir


COMMAND_MODULES = [
    "streamrec.app.commands.ingest",
    "streamrec.app.commands.sketch",
    "streamrec.app.commands.join",
    "streamrec.app.commands.train",
    "streamrec.app.commands.eval",
    "streamrec.app.commands.serve",
    "streamrec.app.demo",
    "streamrec.app.report",
    "streamrec.app.commands.config",
    "streamrec.app.commands.tables",
    "streamrec.benchmarks.cli",
]


def common_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("common options")
    g.add_argument("--config", "-c", metavar="FILE", help="TOML config file (default: built-in defaults)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key (repeatable); env STREAMREC_SECTION__KEY does the same")
    g.add_argument("--bootstrap", metavar="HOST:PORT",
                   help="use this Kafka cluster instead of the embedded broker")
    g.add_argument("--data-dir", metavar="DIR", default=os.environ.get("STREAMREC_DATA_DIR") or None,
                   help="root every relative data path here (data/store -> DIR/store, ...) and keep the trainer's "
                        "metrics log in DIR/metrics.jsonl (env STREAMREC_DATA_DIR)")
    g.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    g.add_argument("--log-format", choices=LOG_FORMATS, default=os.environ.get("STREAMREC_LOG_FORMAT") or "text",
                   help="text (default) or json: one JSON object per line, for log shippers (env STREAMREC_LOG_FORMAT)")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = parse_overrides(args.overrides or [])
    if getattr(args, "bootstrap", None):
        overrides["kafka.bootstrap"] = args.bootstrap
    cfg = load_config(args.config, overrides)
    if getattr(args, "data_dir", None):
        cfg = apply_data_dir(cfg, args.data_dir)
    return cfg


@contextlib.contextmanager
def kafka_bootstrap(cfg: Config, create_topics: bool = True) -> Iterator[str]:
    """Yield a bootstrap address: the configured cluster, or a fresh embedded broker."""
    from streamrec.ingest import EmbeddedBroker, client_settings, ensure_topics, pipeline_topics, wait_for_broker

    if cfg.kafka.bootstrap:
        security = client_settings(cfg.kafka)
        wait_for_broker(cfg.kafka.bootstrap, cfg.kafka.connect_timeout_s, security=security)
        if create_topics:
            ensure_topics(cfg.kafka.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks), security=security)
        yield cfg.kafka.bootstrap
        return
    if cfg.kafka.security_protocol != "PLAINTEXT":
        raise ConfigError(f"kafka.security_protocol={cfg.kafka.security_protocol} needs kafka.bootstrap (or --bootstrap): "
                          "the embedded broker speaks PLAINTEXT only")
    with EmbeddedBroker() as broker:
        logging.getLogger("streamrec").info("embedded broker listening on %s", broker.bootstrap)
        if create_topics:
            ensure_topics(broker.bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
        yield broker.bootstrap


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(
        prog="streamrec",
        description="Streaming online learning for recommendation models: Kafka in, tiered embeddings, gRPC out.",
    )
    parser.add_argument("--version", action="version", version=f"streamrec {streamrec.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .procs import tie_to_supervisor

    tie_to_supervisor()  # a child of `streamrec demo` or `streamrec join --workers`: it dies with that parent
    parser = build_parser()
    args = parser.parse_args(argv)
    fmt = getattr(args, "log_format", "text")
    try:
        setup_logging(getattr(args, "log_level", "INFO"), fmt)
    except ValueError as e:
        print(f"streamrec: {e}", file=sys.stderr)
        return 2
    try:
        code = int(args.func(args) or 0)
    except ConfigError as e:
        return _fail(fmt, f"streamrec: config error: {e}", 2)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        resource = resource_error_line(e)  # disk full, read-only, out of file handles: one line, not a traceback
        if resource is not None:
            logging.getLogger("streamrec").debug("error", exc_info=True)
            return _fail(fmt, f"streamrec {args.command}: {resource}", 1)
        line = _port_error_line(e)
        if line is not None:
            logging.getLogger("streamrec").debug("error", exc_info=True)
            return _fail(fmt, f"streamrec {args.command}: {line}", 1)
        if isinstance(e, (StreamrecError, FileNotFoundError, PermissionError)):  # what the user can fix
            logging.getLogger("streamrec").debug("error", exc_info=True)
            return _fail(fmt, f"streamrec {args.command}: {type(e).__name__}: {e}", 1)
        raise
    if argv is None and getattr(args, "exit_when_done", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End the program at once. A command that sets ``exit_when_done`` has closed everything it owns when it
    returns; the interpreter's own teardown of the modules torch and grpc load is slow, and a supervisor
    stopping the command (a test, docker, systemd) waits for it. Only the program's entry point (``argv`` None)
    exits so: a caller of :func:`main` in its own process gets the code back."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to lose
            pass
    os._exit(code)


def _fail(fmt: str, line: str, code: int) -> int:
    """The one error line: plain text, or a JSON object when logs are JSON (a shipper parses every line)."""
    if fmt == "json":
        import json

        line = json.dumps({"level": "error", "logger": "streamrec", "msg": line, "exit_code": code})
    print(line, file=sys.stderr, flush=True)
    return code


def _port_error_line(e: BaseException) -> str | None:
    """A listening port that is taken, found late (gRPC, the metrics server): one line saying so."""
    import errno

    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"an address this process listens on is already in use ({e}): stop the other process or choose " \
               "another port (serving.port, trainer.metrics_port, broker --port)"
    if isinstance(e, RuntimeError) and "Failed to bind to address" in str(e):
        addr = str(e).split("address", 1)[1].split(";", 1)[0].strip()
        return f"cannot listen on {addr}: the port is in use or the address is not this machine's; choose " \
               "another (serving.port / serving.host)"
    return None


if __name__ == "__main__":
    sys.exit(main())
