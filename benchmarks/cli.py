"""``streamrec bench NAME [--quick] [--json]``: run one benchmark script from this package."""

from __future__ import annotations

import argparse
import importlib

NAMES = ["ingest", "store", "sketch", "train", "serve", "fuzz", "scale", "e2e", "freshness", "quality", "merge", "join",
         "incidents", "tables", "cluster"]


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints ratios against a baseline measured in the same run)")
    p.add_argument("name", choices=NAMES, help="which part to measure")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options for the benchmark (--quick, --json, ...)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    try:
        mod = importlib.import_module(f"{__package__}.bench_{args.name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__package__}.bench_{args.name}":
            print(f"streamrec: benchmark {args.name!r} is not available in this build")
            return 2
        raise
    return int(mod.main(list(args.rest)) or 0)
