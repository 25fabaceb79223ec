"""The ``streamrec`` command line: one entry point, one subcommand per part.

Each group of subcommands lives in a module exposing ``register(subparsers, common)``
(``streamrec.app.commands.*``, the demo, the report, the benchmarks); this module owns
only the shared options (``--config``, ``--set``, ``--bootstrap``, ``--log-level``),
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
import sys
from typing import Iterator

import streamrec
from streamrec.foundation import Config, ConfigError, load_config, parse_overrides
from streamrec.foundation.errors import StreamrecError
from streamrec.foundation.resources import resource_error_line


COMMAND_MODULES = [
    "streamrec.app.commands.ingest",
    "streamrec.app.commands.sketch",
    "streamrec.app.commands.train",
    "streamrec.app.commands.serve",
    "streamrec.app.demo",
    "streamrec.app.report",
    "streamrec.app.commands.config",
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
    g.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = parse_overrides(args.overrides or [])
    if getattr(args, "bootstrap", None):
        overrides["kafka.bootstrap"] = args.bootstrap
    return load_config(args.config, overrides)


@contextlib.contextmanager
def kafka_bootstrap(cfg: Config, create_topics: bool = True) -> Iterator[str]:
    """Yield a bootstrap address: the configured cluster, or a fresh embedded broker."""
    from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics, wait_for_broker

    if cfg.kafka.bootstrap:
        wait_for_broker(cfg.kafka.bootstrap)
        if create_topics:
            ensure_topics(cfg.kafka.bootstrap, pipeline_topics(cfg))
        yield cfg.kafka.bootstrap
        return
    with EmbeddedBroker() as broker:
        logging.getLogger("streamrec").info("embedded broker listening on %s", broker.bootstrap)
        if create_topics:
            ensure_topics(broker.bootstrap, pipeline_topics(cfg))
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
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "INFO")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("kafka", "aiokafka", "faust", "mode"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"streamrec: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        resource = resource_error_line(e)  # disk full, read-only, out of file handles: one line, not a traceback
        if resource is not None:
            logging.getLogger("streamrec").debug("error", exc_info=True)
            print(f"streamrec {args.command}: {resource}", file=sys.stderr)
            return 1
        if isinstance(e, (StreamrecError, FileNotFoundError, PermissionError)):  # what the user can fix
            logging.getLogger("streamrec").debug("error", exc_info=True)
            print(f"streamrec {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
