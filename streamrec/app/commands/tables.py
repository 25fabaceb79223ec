"""``streamrec tables``: each embedding table's rows and bytes on disk, from a store or a checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "tables", parents=[common],
        help="each embedding table's rows and bytes on disk (a store or checkpoint, read-only)",
        description="Open a store directory read-only (default: store.path; a trainer checkpoint's store/ works "
                    "too) and print, per table: its width, the rows it holds, their bytes as stored and its "
                    "estimated share of the directory's bytes on disk. A full scan of the rows: seconds per "
                    "million rows. With store.max_rows set, how far each table is from its cap.")
    p.add_argument("--store", metavar="DIR", help="the store directory (default: store.path)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=cmd_tables)


def cmd_tables(args) -> int:
    from streamrec.app.cli import config_from_args
    from streamrec.embedding_store import EmbeddingStore, StoreError, table_sizes

    cfg = config_from_args(args)
    path = Path(args.store or cfg.store.path)
    if (path / "store" / "manifest.json").exists():  # a trainer checkpoint directory: its store
        path = path / "store"
    if not (path / "manifest.json").exists():
        raise StoreError(f"no store at {path} (no manifest.json): pass --store DIR, a store or checkpoint directory")
    store = EmbeddingStore.restore(str(path), read_only=True, device="cpu")
    try:
        sizes = table_sizes(store)
        dims = {n: t.dim for n, t in store.tables.items()}
    finally:
        store.close()
    cap = cfg.store.max_rows
    report = {"store": str(path), "max_rows": cap,
              "tables": {n: {"dim": dims[n], **v} for n, v in sorted(sizes.items())}}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"store {path}" + (f"  (store.max_rows {cap:,} per table)" if cap else ""))
    print(f"{'table':<20} {'dim':>5} {'rows':>12} {'row MiB':>9} {'disk MiB':>9}" + (f" {'of cap':>7}" if cap else ""))
    for n, v in report["tables"].items():
        line = f"{n:<20} {v['dim']:>5} {v['rows']:>12,} {v['row_bytes'] / 2**20:>9.2f} {v['disk_bytes'] / 2**20:>9.2f}"
        print(line + (f" {v['rows'] / cap:>6.0%}" if cap else ""))
    return 0
