"""``streamrec report RUN_DIR``: a PNG and a Markdown summary of a run.

Reads the trainer's metrics log (``metrics.jsonl``: one JSON record per
interval: AUC, events/s, lag, freshness) and, when present, the demo's view log
(``view.jsonl``: hot set, served version and freshness over time), its config
(``config.toml``: the run settings) and its evaluation (``evaluation.json``: the
served model's AUC on held-out events, the Bayes-optimal AUC of generated data,
Predict latency), so that a person can see what the run did. ``streamrec train
--data-dir DIR`` writes ``DIR/metrics.jsonl``: ``streamrec report DIR`` reads it.

``--lines`` adds the running server's model lines side by side (per line: share, served version, requests,
mean score; per shadow pair: agreement and calibration); ``streamrec lines [--auc]`` prints them alone, and
with ``--auc`` joins the shadow's per-event scores with the events topic's labels by request_id into each
side's AUC on the same events.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("report", parents=[common], help="plot and summarise a run directory (metrics.jsonl)")
    p.add_argument("run_dir", help="a run directory written by `streamrec demo` or `streamrec train`")
    p.add_argument("--lines", action="store_true",
                   help="add the running server's model lines side by side (Status of serving.target)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("lines", parents=[common],
                       help="a running server's model lines side by side, the shadow comparison, and with --auc "
                            "each side's AUC on the events whose labels arrived on the events topic")
    p.add_argument("--target", help="host:port (default: serving.target or serving.host:serving.port)")
    p.add_argument("--auc", action="store_true", help="join the shadow's per-event scores (ShadowScores, push "
                   "token) with the events topic's labels by request_id")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to read the events topic")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.set_defaults(func=cmd_lines)


def cmd_report(args) -> int:
    table = None
    if args.lines:
        from streamrec.app.cli import config_from_args
        from streamrec.serving import ServingClient

        cfg = config_from_args(args)
        with ServingClient.from_config(cfg.serving) as c:
            table = lines_table(c.status())
    png, md = write_report(Path(args.run_dir), lines=table)
    print(md.read_text())
    print(f"wrote {md} and {png}")
    return 0


def lines_table(status: dict, auc: dict | None = None) -> list[str]:
    """Markdown: every model line side by side (from a ``Status`` answer as a dict), then each shadow pair;
    ``auc``: ``shadow_auc``'s figures, added to the pairs."""
    lines = status.get("lines") or []
    if not lines:
        return []
    out = ["## Model lines", "", "| line | share | served version | newest | pinned | held | requests answered | "
           "mean score | fallbacks to main | newest's live drift (mean abs log-odds diff, score ratio, events) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in lines:
        role = "shadow" if x.get("shadow") else f"{float(x.get('share', 0)):.0%}"
        d = x.get("drift")
        drift = (f"{float(d.get('mean_abs_logit_diff', 0)):.3f}, {float(d.get('score_ratio', 0)):.3f}, "
                 f"{d.get('events', 0)}" if d else "-")
        out.append(f"| {x['model_line']} | {role} | {x.get('version', 0)} | {x.get('newest_version', 0)} | "
                   f"{'yes' if x.get('pinned') else 'no'} | {x.get('held_reason') or '-'} | {x.get('requests', 0)} | "
                   f"{float(x.get('mean_score', 0)):.4f} | {x.get('fallbacks', 0)} | {drift} |")
    pairs = status.get("shadow") or []
    if pairs:
        out += ["", "| answering line / shadow | events | mean abs diff | share differing > 0.1 | calibration "
                "(shadow / answer) | AUC answer / shadow (labelled events) |", "| --- | --- | --- | --- | --- | --- |"]
        for p in pairs:
            a = (auc or {}).get((p["model_line"], p["shadow_line"]))
            aucs = f"{a['auc_line']:.4f} / {a['auc_shadow']:.4f} ({a['events']})" if a else "-"
            out.append(f"| {p['model_line']} / {p['shadow_line']} | {p.get('events', 0)} | "
                       f"{float(p.get('mean_abs_diff', 0)):.4f} | {float(p.get('disagree_share', 0)):.3f} | "
                       f"{float(p.get('calibration', 0)):.3f} | {aucs} |")
    return out + [""]


def topic_labels(cfg, request_ids: set, timeout: float) -> dict:
    """``request_id -> label`` of the events on ``kafka.events_topic`` whose request id is in ``request_ids``."""
    from streamrec.foundation import EventError
    from streamrec.ingest import Decoder, EventSchema, client_settings, read_topic

    dec = Decoder(EventSchema.from_sections(cfg.model, cfg.ingest))
    out = {}
    for rec in read_topic(cfg.kafka.bootstrap, cfg.kafka.events_topic, timeout=timeout,
                          security=client_settings(cfg.kafka)):
        try:
            b = dec.decode(rec.value)
        except EventError:
            continue  # a record the trainer dead-letters carries no label it learns from
        for rid, y in zip(b.request_ids or [], b.labels.tolist()):
            if rid in request_ids:
                out[rid] = y
    return out


def cmd_lines(args) -> int:
    from streamrec.app.cli import config_from_args
    from streamrec.serving import ServingClient, serving_target, shadow_auc

    import grpc

    cfg = config_from_args(args)
    c = ServingClient(args.target or serving_target(cfg.serving), token=cfg.serving.predict_token, tls_ca=cfg.serving.tls_ca,
                      push_token=cfg.serving.push_token)
    try:
        st = c.status()
        auc = None
        if args.auc:
            log = c.shadow_scores()
            auc = shadow_auc(log, topic_labels(cfg, {e[0] for e in log}, args.timeout))
    except grpc.RpcError as e:
        print(f"streamrec lines: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        c.close()
    if args.json:
        print(json.dumps({"lines": st.get("lines", []), "shadow": st.get("shadow", []),
                          "auc": [{"line": a, "shadow": b, **f} for (a, b), f in (auc or {}).items()]}))
    else:
        print("\n".join(lines_table(st, auc)) or "the server reports no model lines")
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


def _settings(run_dir: Path, ev: dict) -> list[tuple[str, str]]:
    """The run's settings that explain its numbers, from the config the processes read (``config.toml``)."""
    import tomllib

    try:
        cfg = tomllib.loads((run_dir / "config.toml").read_text())
    except (OSError, ValueError):
        return []
    g = lambda sec, key, default="-": cfg.get(sec, {}).get(key, default)  # noqa: E731
    fields = [f.get("name") for f in g("model", "fields", []) if isinstance(f, dict)]
    rows = [
        ("data", str(ev.get("source", "-"))),
        ("events produced", f"{ev['produced']:,}" if isinstance(ev.get("produced"), int) else "-"),
        ("producer rate", f"{ev['produce_rate']:,.0f} events/s" if ev.get("produce_rate") else "as fast as possible"
         if "produce_rate" in ev else "-"),
        ("model", f"{len(fields)} sparse fields ({', '.join(fields[:6])}{', ...' if len(fields) > 6 else ''}), "
                  f"dense_dim {g('model', 'dense_dim')}, embedding_dim {g('model', 'embedding_dim')}"),
        ("trainer", f"device {g('trainer', 'device')}, batch {g('trainer', 'batch_size')}, schedule "
                    f"{g('trainer', 'schedule')}, {g('trainer', 'ranks', 1)} rank(s), checkpoint every "
                    f"{g('trainer', 'checkpoint_every_s')} s / {g('trainer', 'checkpoint_every_events')} events"),
        ("hot set", f"budget {g('hot', 'budget_rows')} rows, published at least every "
                    f"{g('sketch', 'publish_interval_s')} s"),
        ("kafka", f"{g('kafka', 'partitions')} partitions, codec {g('kafka', 'codec')}"),
    ]
    return rows


def write_report(run_dir: Path, lines: list[str] | None = None) -> tuple[Path, Path]:
    """``report.png`` and ``report.md`` of a run directory: settings, results, and six panels over time;
    ``lines``: the model lines' table (``lines_table``), placed after the results."""
    from .evaluation import read_evaluation

    run_dir = Path(run_dir)
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    if not metrics:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: nothing to report")
    view = _read_jsonl(run_dir / "view.jsonl")
    ev = read_evaluation(run_dir)
    _add_elapsed(metrics, view)
    served_freshness = any(isinstance(r.get("freshness_s"), (int, float)) for r in view)  # the demo's served model
    png = _plot(run_dir / "report.png", metrics, view, ev, served_freshness)
    md = run_dir / "report.md"
    md.write_text("\n".join(_markdown(run_dir, metrics, view, ev, served_freshness)
                            + [*(lines or []), f"![run]({png.name})", ""]))
    return png, md


def _add_elapsed(metrics: list[dict], view: list[dict]) -> None:
    """Each record's ``elapsed_s``: seconds since the first record of either log (the demo's view starts before
    training does); a record without a numeric time has none."""
    t0 = min([r["ts"] for r in metrics if isinstance(r.get("ts"), (int, float))]
             + [r["t"] for r in view if isinstance(r.get("t"), (int, float))], default=0)
    for r in metrics:
        if isinstance(r.get("ts"), (int, float)):
            r["elapsed_s"] = r["ts"] - t0
    for r in view:
        if isinstance(r.get("t"), (int, float)):  # "t": null raised TypeError
            r["elapsed_s"] = r["t"] - t0


def _plot(png: Path, metrics: list[dict], view: list[dict], ev: dict, served_freshness: bool) -> Path:
    """The six panels over time, written to ``png``: training on the top row, hot set, snapshots and freshness
    below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    _plot_training(axes[0], metrics, ev)
    _plot_serving(axes[1], metrics, view, served_freshness)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return png


_DOT = dict(marker=".", markersize=4)  # a 20-second run has ~10 records: show each one


def _plot_training(axes, metrics: list[dict], ev: dict) -> None:
    """Progressive validation (with the served and Bayes-optimal AUCs), throughput and consumer lag."""
    ax = axes[0]
    for key, label in (("auc", "AUC since start"), ("window_auc", "AUC, sliding window")):
        ax.plot(*_series(metrics, "events", key), label=label, **_DOT)
    for key, label, style in (("served_auc", "served model, held-out events", "--"),
                              ("bayes_auc", "Bayes-optimal (generator's truth)", ":")):
        if isinstance(ev.get(key), (int, float)):
            ax.axhline(ev[key], linestyle=style, color="black" if key == "bayes_auc" else "tab:purple", label=label)
    ax.set_xlabel("events trained")
    ax.set_ylabel("AUC")
    ax.set_title("Progressive validation")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[1]
    ax.plot(*_series(metrics, "elapsed_s", "events_per_s"), **_DOT)
    ax.set_xlabel("seconds")
    ax.set_ylabel("events/s")
    ax.set_title("Training throughput")
    ax = axes[2]
    ax.plot(*_series(metrics, "elapsed_s", "lag"), color="tab:orange", **_DOT)
    ax.set_xlabel("seconds")
    ax.set_ylabel("records behind the topic head")
    ax.set_title("Consumer lag (trainer)")


def _plot_serving(axes, metrics: list[dict], view: list[dict], served_freshness: bool) -> None:
    """The hot set, the snapshot (or served) versions and freshness by the Kafka clock."""
    ax = axes[0]
    ax.plot(*_series(metrics, "elapsed_s", "hot_fraction"), label="hot fraction of trained samples", **_DOT)
    ax.plot(*_series(metrics, "elapsed_s", "hit_rate"), label="hot-tier hit rate of lookups", **_DOT)
    ax.plot(*_series(view or metrics, "elapsed_s", "hot_coverage"), label="hot-set coverage (sketch estimate)", **_DOT)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("seconds")
    ax.set_title("Hot set")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[1]
    ax.step(*_series(view or metrics, "elapsed_s", "served_version" if view else "snapshot_version"),
            where="post", label="served version" if view else "snapshot version")
    ax.set_xlabel("seconds")
    ax.set_ylabel("version")
    ax.set_title("Snapshots")
    ax = axes[2]
    if served_freshness:  # the served model (demo)
        ax.plot(*_series(view, "elapsed_s", "freshness_s"), color="tab:green", label="served: since in Kafka", **_DOT)
    ax.plot(*_series(metrics, "elapsed_s", "freshness_kafka_s"), color="tab:olive", label="trained: since in Kafka",
            **_DOT)
    ax.set_xlabel("seconds")
    ax.set_ylabel("seconds")
    ax.set_title("Freshness (age of the newest event, Kafka clock)")
    ax.legend(loc="upper right", fontsize=8)


def _fmt(v, f="{:.4f}") -> str:
    return f.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _med(xs):
    xs = sorted(x for x in xs if isinstance(x, (int, float)) and math.isfinite(x))
    return xs[len(xs) // 2] if xs else None


def _col(records: list[dict], key: str) -> list:
    return [r.get(key) for r in records]


def _markdown(run_dir: Path, metrics: list[dict], view: list[dict], ev: dict, served_freshness: bool) -> list[str]:
    """The report's title, run settings (when its config is there) and results table, one line each."""
    last = metrics[-1]
    served = [r.get("served_version") for r in view if r.get("served_version") is not None]
    lag = [x for x in _col(metrics, "lag") if isinstance(x, (int, float)) and x >= 0]
    fresh_kafka = _med(_col(view, "freshness_s")) if served_freshness else _med(_col(metrics, "freshness_kafka_s"))
    fresh_event = _med(_col(view, "freshness_event_s")) if view else _med(_col(metrics, "freshness_event_s"))
    elapsed = max((r.get("elapsed_s", 0) for r in metrics + view if isinstance(r.get("elapsed_s"), (int, float))),
                  default=0)
    settings = _settings(run_dir, ev)
    out = [f"# streamrec run {run_dir.name}", ""]
    if settings:
        out += ["## Run settings", "", "| setting | value |", "| --- | --- |"]
        out += [f"| {k} | {v} |" for k, v in settings] + [""]
    out += [
        "## Results", "",
        "| metric | value |",
        "| --- | --- |",
        f"| run length (first to last record) | {_fmt(elapsed, '{:.0f} s')} |",
        f"| events trained | {_fmt(last.get('events'), '{:,}')} |",
        f"| progressive AUC since start | {_fmt(last.get('auc'))} |",
        f"| progressive AUC, last window | {_fmt(last.get('window_auc'))} |",
        f"| logloss since start | {_fmt(last.get('logloss'))} |",
    ]
    for task, f in (last.get("tasks") or {}).items():  # a model of several tasks: each over its labelled events
        out.append(f"| task {task}: progressive AUC / logloss since start ({_fmt(f.get('labelled'), '{:,}')} "
                   f"labelled events) | {_fmt(f.get('auc'))} / {_fmt(f.get('logloss'))} |")
    out += _evaluation_rows(ev)
    return out + [
        f"| median training events/s | {_fmt(_med(_col(metrics, 'events_per_s')), '{:,.0f}')} |",
        f"| consumer lag, max / last (records) | {_fmt(max(lag) if lag else None, '{:,}')} / "
        f"{_fmt(lag[-1] if lag else None, '{:,}')} |",
        f"| hot fraction of trained samples (last) | {_fmt(last.get('hot_fraction'), '{:.1%}')} |",
        f"| hot-tier hit rate (last) | {_fmt(last.get('hit_rate'), '{:.1%}')} |",
        f"| dead letters | {_fmt(last.get('dead_letters'), '{:,}')} |",
        f"| last snapshot version built by the trainer | {_fmt(last.get('snapshot_version'), '{:,}')} |",
        f"| last served version | {served[-1] if served else '-'} |",
        f"| median freshness, since the event entered Kafka ({'served' if served_freshness else 'trained'} "
        f"model) | {_fmt(fresh_kafka, '{:.1f} s')} |",
        f"| median age by the events' own time | {_fmt(fresh_event, '{:,.1f} s')} |",
        "",
    ]


def _evaluation_rows(ev: dict) -> list[str]:
    """The results rows of the run's evaluation: the served model's AUC, the Bayes-optimal AUC of generated data
    and Predict latency, each when the evaluation has it."""
    out = []
    held = "held-out" if ev.get("held_out", True) else "last events of the file (trained on: no held-out part)"
    if ev:
        out.append(f"| served model's AUC, {_fmt(ev.get('events'), '{:,}')} {held} events via Predict "
                   f"(v{ev.get('served_version', '-')}) | {_fmt(ev.get('served_auc'))} |")
    if isinstance(ev.get("bayes_auc"), (int, float)):
        out.append(f"| Bayes-optimal AUC of the same events (generated data: the ceiling) | {_fmt(ev['bayes_auc'])} |")
    lat = ev.get("predict_latency_ms") or {}
    if lat:
        out.append(f"| Predict latency, one event per call ({ev.get('latency_calls', '-')} calls) | p50 "
                   f"{_fmt(lat.get('p50'), '{:.2f}')} ms · p90 {_fmt(lat.get('p90'), '{:.2f}')} ms · p99 "
                   f"{_fmt(lat.get('p99'), '{:.2f}')} ms |")
    return out
