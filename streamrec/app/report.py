"""``streamrec report RUN_DIR``: a PNG and a Markdown summary of a run.

Reads the trainer's metrics log (``metrics.jsonl``: one JSON record per
interval) and, when present, the demo's view log (``view.jsonl``: hot set and
served version over time) so that a person can see what the run did.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("report", help="plot and summarise a run directory (metrics.jsonl)")
    p.add_argument("run_dir", help="a run directory written by `streamrec demo` or `streamrec train`")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    png, md = write_report(Path(args.run_dir))
    print(md.read_text())
    print(f"wrote {md} and {png}")
    return 0


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):  # a stray non-object line made every r.get(...) below raise
            out.append(rec)
    return out


def _series(records: list[dict], x: str, y: str) -> tuple[list, list]:
    xs, ys = [], []
    for r in records:
        vx, vy = r.get(x), r.get(y)
        if isinstance(vx, (int, float)) and isinstance(vy, (int, float)) and math.isfinite(vy):
            xs.append(vx)
            ys.append(vy)
    return xs, ys


def write_report(run_dir: Path) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    if not metrics:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: nothing to report")
    view = _read_jsonl(run_dir / "view.jsonl")
    t0 = min((r["ts"] for r in metrics if isinstance(r.get("ts"), (int, float))), default=0)  # none: ValueError
    for r in metrics:
        if isinstance(r.get("ts"), (int, float)):
            r["elapsed_s"] = r["ts"] - t0
    for r in view:
        if isinstance(r.get("t"), (int, float)):  # "t": null raised TypeError
            r["elapsed_s"] = r["t"] - t0

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    for key, label in (("auc", "AUC since start"), ("window_auc", "AUC, sliding window")):
        ax.plot(*_series(metrics, "events", key), label=label)
    ax2 = ax.twinx()
    ax2.plot(*_series(metrics, "events", "window_logloss"), color="tab:red", alpha=0.6, label="logloss (window)")
    ax.set_xlabel("events trained")
    ax.set_ylabel("AUC")
    ax2.set_ylabel("logloss")
    ax.set_title("Progressive validation")
    ax.legend(loc="lower right")
    ax = axes[0][1]
    ax.plot(*_series(metrics, "elapsed_s", "events_per_s"))
    ax.set_xlabel("seconds")
    ax.set_ylabel("events/s")
    ax.set_title("Training throughput")
    ax = axes[1][0]
    ax.plot(*_series(metrics, "elapsed_s", "hot_fraction"), label="hot fraction of trained samples")
    ax.plot(*_series(metrics, "elapsed_s", "hit_rate"), label="hot-tier hit rate of lookups")
    ax.plot(*_series(view or metrics, "elapsed_s", "hot_coverage"), label="hot-set coverage (sketch estimate)")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("seconds")
    ax.set_title("Hot set")
    ax.legend(loc="lower right")
    ax = axes[1][1]
    ax.step(*_series(view or metrics, "elapsed_s", "served_version" if view else "snapshot_version"),
            where="post", label="served version" if view else "snapshot version")
    ax.set_xlabel("seconds")
    ax.set_ylabel("version")
    if view:
        ax3 = ax.twinx()
        ax3.plot(*_series(view, "elapsed_s", "freshness_s"), color="tab:green", alpha=0.7, label="freshness (s)")
        ax3.set_ylabel("freshness s")
    ax.set_title("Snapshots and freshness")
    fig.tight_layout()
    png = run_dir / "report.png"
    fig.savefig(png, dpi=90)
    plt.close(fig)

    last = metrics[-1]
    served = [r.get("served_version") for r in view if r.get("served_version") is not None]
    fresh = [r.get("freshness_s") for r in view if isinstance(r.get("freshness_s"), (int, float))]

    def fmt(v, f="{:.4f}"):
        return f.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"

    rate = [r.get("events_per_s") for r in metrics if isinstance(r.get("events_per_s"), (int, float))]
    md = run_dir / "report.md"
    md.write_text(
        "\n".join(
            [
                f"# streamrec run {run_dir.name}",
                "",
                "| metric | value |",
                "| --- | --- |",
                f"| events trained | {fmt(last.get('events'), '{:,}')} |",
                f"| progressive AUC since start | {fmt(last.get('auc'))} |",
                f"| progressive AUC, last window | {fmt(last.get('window_auc'))} |",
                f"| logloss since start | {fmt(last.get('logloss'))} |",
                f"| median training events/s | {fmt(sorted(rate)[len(rate) // 2] if rate else None, '{:,.0f}')} |",
                f"| hot fraction of trained samples (last) | {fmt(last.get('hot_fraction'), '{:.1%}')} |",
                f"| hot-tier hit rate (last) | {fmt(last.get('hit_rate'), '{:.1%}')} |",
                f"| dead letters | {fmt(last.get('dead_letters'), '{:,}')} |",
                f"| last snapshot version built by the trainer | {fmt(last.get('snapshot_version'), '{:,}')} |",
                f"| last served version | {served[-1] if served else '-'} |",
                f"| median freshness | {fmt(sorted(fresh)[len(fresh) // 2] if fresh else None, '{:.1f} s')} |",
                "",
                f"![run]({png.name})",
                "",
            ]
        )
    )
    return png, md
