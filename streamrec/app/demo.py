"""``streamrec demo``: the whole pipeline on one machine, as it runs in production.

Starts the embedded broker (or uses ``--bootstrap``), then the serving endpoint and
the popularity-sketch worker as separate processes, streams a generated (or replayed)
dataset in once serving is up, starts the trainer beside serving (or, when it has an idle
exit, ``trainer.idle_exit_s``, once the stream has begun), shows one live view, and
finally scores a few held-out events through the served model's gRPC ``Predict``. With
``--delayed-feedback`` the producer sends impressions and the actions that follow them
instead of labelled events, and ``streamrec join`` runs in the pipeline to turn them into
the labelled events the trainer reads. Every child is stopped on the way out, also on
Ctrl-C or when one of them dies (the demo then names it and exits non-zero). The last
stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import secrets
import signal
import sys
import threading
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .cli import config_from_args, kafka_bootstrap
from streamrec.foundation import ConfigError
from streamrec.app.config import Config, save_config
from .procs import Child, Supervisor

if TYPE_CHECKING:
    from streamrec.serving import ServingClient
    from streamrec.sketch import HotSetFollower

log = logging.getLogger("streamrec.app.demo")

EVAL_EVENTS = 2000  # events scored through Predict at the end for the served model's AUC


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="run the whole pipeline on one machine and score through gRPC")
    p.add_argument("--events", type=int, default=None,
                   help="events to stream and train on (default 300000; with --data: 0 or none = the whole file)")
    p.add_argument("--rate", type=float, default=5000.0,
                   help="events/s the producer sends, a live stream (default 5000; 0 = as fast as it can)")
    p.add_argument("--data", metavar="FILE",
                   help="replay this file (Criteo TSV, Avazu CSV, Parquet, JSON lines) instead of generated events")
    p.add_argument("--layout", choices=["auto", "criteo", "avazu", "events"], default="auto",
                   help="layout of --data (default: from the file name/extension)")
    p.add_argument("--run-dir", metavar="DIR", help="where logs, metrics, checkpoints and the report go")
    p.add_argument("--predict", type=int, default=5, help="held-out events to score through gRPC at the end")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--no-live", action="store_true", help="plain log lines instead of the live view")
    p.add_argument("--trainers", type=int, default=None, metavar="N",
                   help="train with a group of N trainer ranks (torch.distributed) and run N sketch workers")
    p.add_argument("--delayed-feedback", action="store_true",
                   help="produce impressions and their later actions (join.impressions_topic, join.actions_topic) "
                        "and run `streamrec join` (join.mode) to label them; the live view shows the join's "
                        "figures (docs/joining.md)")
    p.set_defaults(func=cmd_demo)


class DemoFailure(RuntimeError):
    pass


@dataclass
class View:
    """What the live view shows; filled from the metrics log, hot-set topic and serving Status."""

    started: float = field(default_factory=time.monotonic)
    produced: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    hot_version: int | None = None
    hot_rows: int = 0
    hot_coverage: float | None = None
    served_version: int | None = None
    newest_version: int = 0  # the newest version serving installed (above served_version while the guard holds it)
    held_reason: str = ""  # why serving's guard holds newest_version back ("" = nothing held)
    freshness_s: float | None = None  # served model: now - when its newest event entered Kafka
    freshness_event_s: float | None = None  # served model: now - its newest event's own ts
    phase: str = "starting"
    join: dict[str, Any] | None = None  # --delayed-feedback: the joiner's figures, from its /metrics page

    def rows(self) -> list[tuple[str, str]]:
        m = self.metrics

        def f(key, fmt="{:.4f}"):
            v = m.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else "-"

        cov = f"{self.hot_coverage:.1%}" if self.hot_coverage is not None else "-"
        return [
            ("phase", self.phase),
            ("elapsed", f"{time.monotonic() - self.started:.0f} s"),
            ("events produced", f"{self.produced:,}"),
            ("events trained", f("events", "{:,}")),
            ("train events/s", f("events_per_s", "{:,.0f}")),
            ("hot set", f"v{self.hot_version} · {self.hot_rows:,} rows · coverage {cov}" if self.hot_version is not None else "-"),
            ("hot fraction trained", f("hot_fraction", "{:.1%}")),
            ("progressive AUC (window / all)", f"{f('window_auc')} / {f('auc')}"),
            ("logloss (window / all)", f"{f('window_logloss')} / {f('logloss')}"),
            ("dead letters", f("dead_letters", "{:,}")),
            ("snapshot version (trainer)", f("snapshot_version", "{:,}")),
            ("served version", str(self.served_version) if self.served_version is not None else "-"),
            ("freshness (since in Kafka / event time)",
             f"{_secs(self.freshness_s)} / {_secs(self.freshness_event_s)}"),
        ] + (_join_rows(self.join) if self.join is not None else [])


def _join_rows(j: dict[str, Any]) -> list[tuple[str, str]]:
    ex = j.get("examples", {})
    delay = j.get("label_delay_mean_s")
    return [
        ("join examples (positive / negative / fake negative)",
         " / ".join(f"{int(ex.get(k, 0)):,}" for k in ("positive", "negative", "fake_negative"))),
        ("join state rows", f"{int(j.get('state_rows', 0)):,}"),
        ("join label delay (mean, event time)", "-" if delay is None else f"{delay:.1f} s"),
        ("join late / orphan actions", f"{int(j.get('late_actions', 0)):,} / {int(j.get('orphan_actions', 0)):,}"),
    ]


def join_figures(port: int) -> dict[str, Any] | None:
    """The joiner's figures from its Prometheus page: examples by outcome, state rows, mean label delay
    (event time), late and orphan actions; None while the page does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except OSError:
        return None
    out: dict[str, Any] = {"examples": {}}
    dsum = dcount = 0.0
    for fam in text_string_to_metric_families(body):
        for smp in fam.samples:
            if smp.name == "streamrec_join_examples_total":
                out["examples"][smp.labels.get("outcome", "")] = smp.value
            elif smp.name == "streamrec_join_state_rows":
                out["state_rows"] = smp.value
            elif smp.name == "streamrec_join_label_delay_seconds_sum":
                dsum = smp.value
            elif smp.name == "streamrec_join_label_delay_seconds_count":
                dcount = smp.value
            elif smp.name == "streamrec_join_actions_late_total":
                out["late_actions"] = smp.value
            elif smp.name == "streamrec_join_actions_orphan_total":
                out["orphan_actions"] = smp.value
    out["label_delay_mean_s"] = dsum / dcount if dcount else None
    return out


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s" if v < 86_400 else f"{v / 86_400:,.0f} days"


def _last_json_line(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            lines = fh.read().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
    return {}


def demo_config(cfg: Config, args, run_dir: Path) -> Config:
    """Point every path of the config into the run directory and fill ports and the token."""
    from streamrec.ingest import free_port

    if args.events is not None and args.events < 0:  # else every child failed on trainer.max_events
        raise ConfigError(f"--events must be >= 0, got {args.events}")
    if args.events == 0 and not args.data:  # 0 means "the whole file" only when there is a file
        raise ConfigError("--events 0: generated data needs a positive number of events (leave it out for 300000)")
    if args.data:
        from streamrec.ingest import detect_format, layout_config

        from .data_schema import model_for_file

        layout = args.layout if args.layout != "auto" else detect_format(args.data)
        if layout in ("criteo", "avazu"):
            # every process reads this config, so all agree on the fields
            cfg = dataclasses.replace(cfg, model=layout_config(layout, cfg.model))
        else:  # the file's own fields and dense width, unless a model config says otherwise (then they must fit)
            cfg = model_for_file(cfg, args, args.data, "demo", format=None if layout == "events" else layout)
    if getattr(args, "delayed_feedback", False) and args.data:
        raise ConfigError("--delayed-feedback generates its impressions and actions: leave out --data")
    if args.trainers is not None and args.trainers < 1:
        raise ConfigError(f"--trainers must be >= 1, got {args.trainers}")
    if not args.data:
        args.events = args.events or 300_000
    trainer = {"checkpoint_dir": str(run_dir / "checkpoints"), "snapshot_dir": str(run_dir / "snapshots"),
               "log_path": str(run_dir / "metrics.jsonl"), "max_events": args.events or 0,
               # short intervals so a two-minute demo shows several hot sets, checkpoints and snapshots
               "checkpoint_every_events": min(cfg.trainer.checkpoint_every_events,
                                              max(10_000, (args.events or 60_000) // 6)),
               "checkpoint_every_s": min(cfg.trainer.checkpoint_every_s, 10.0)}
    if args.trainers is not None:
        trainer["ranks"] = args.trainers  # `streamrec train` starts the group; topics get >= N partitions
    if args.data:  # a file ends: the trainer stops once the stream has been quiet for a while
        trainer["idle_exit_s"] = cfg.trainer.idle_exit_s or 15.0
    port = free_port()
    serving = {"data_dir": str(run_dir / "serving"), "host": "127.0.0.1", "port": port,
               "target": f"127.0.0.1:{port}",  # the trainer pushes only to a configured target
               "push_token": cfg.serving.push_token or secrets.token_hex(16)}
    if (os.cpu_count() or 1) <= 4:
        # trainer, sketch, serving and the producer share a few cores: one torch thread each
        # beats threads that stall each other
        trainer["torch_threads"] = cfg.trainer.torch_threads or 1
        serving["torch_threads"] = cfg.serving.torch_threads or 1
    cfg = cfg.with_values(
        trainer=trainer, serving=serving, store={"path": str(run_dir / "trainer-store")},
        sketch={"state_dir": str(run_dir / "sketch"), "publish_interval_s": min(cfg.sketch.publish_interval_s, 3.0)},
        # generated events carry the current time, so the served model's freshness means something
        generator={"start_ts_ms": int(time.time() * 1000),
                   "events_per_s": args.rate if args.rate > 0 else 20_000.0})
    if getattr(args, "delayed_feedback", False):
        cfg = _delayed_config(cfg, args, run_dir)
    return cfg


DELAY_MEDIAN_S = 1.0  # the demo's clicks: a lognormal delay of median 1 s (sigma 1.5) after the impression


def _delayed_config(cfg: Config, args, run_dir: Path) -> Config:
    """The joiner's state and metrics port in the run; an attribution window that closes within the demo
    (generated event time is wall time here: a one-hour window would hold every negative past the end); the
    trainer stops after exactly the examples the join writes for the produced stream (the pure join, per
    partition as the producer partitions, gives that number: the joiner's output is deterministic)."""
    from streamrec.ingest import free_port
    from streamrec.joiner import DelayedStream

    j = cfg.join
    cfg = cfg.with_values(join={"state_dir": str(run_dir / "join"), "metrics_host": "127.0.0.1",
                                "metrics_port": free_port(), "window_s": min(j.window_s, 10.0),
                                "allowed_lateness_s": min(j.allowed_lateness_s, 2.0),
                                "orphan_wait_s": min(j.orphan_wait_s, 5.0)})
    k = max(args.predict, 1, EVAL_EVENTS)
    imps, acts, truth = DelayedStream(cfg.model, cfg.generator, seed=cfg.generator.seed,
                                      delay_median_s=DELAY_MEDIAN_S).generate(args.events + k)
    held = {ev["request_id"] for ev in imps[args.events:]}
    acts = [a for a in acts if a["request_id"] not in held]
    args.delayed = (imps[: args.events], acts, [{**ev, "label": truth[ev["request_id"]]} for ev in imps[args.events:]])
    return cfg.with_values(trainer={"max_events": expected_examples(cfg, imps[: args.events], acts)})


def _partition(rid: str, partitions: int) -> int:
    import zlib

    return zlib.crc32(rid.encode()) % partitions


def expected_examples(cfg: Config, imps: list[dict], acts: list[dict]) -> int:
    """How many labelled events the joiner writes for these impressions and actions, partitioned as
    :func:`_produce_delayed` sends them."""
    from streamrec.joiner import Action, JoinRules, JoinState

    rules = JoinRules.from_config(cfg.join)
    parts = int(cfg.kafka.partitions)
    states = [JoinState(rules) for _ in range(parts)]
    n = 0
    for ev in imps:
        n += len(states[_partition(ev["request_id"], parts)].impression(ev["request_id"], ev["ts"], ev))
    for a in acts:
        n += len(states[_partition(a["request_id"], parts)].action(Action(a["request_id"], a["ts"], a["type"])))
    return n


def _produce_delayed(cfg: Config, bootstrap: str, imps: list[dict], acts: list[dict], rate: float, view: View,
                     stop: threading.Event, errors: list) -> None:
    """Impressions and actions, one JSON record each keyed by request_id (partition: a hash of it, the same on
    both topics), in event-time order, paced at ``rate`` impressions/s; the actions due after the last
    impression follow it at once."""
    import orjson

    from streamrec.ingest import client_settings, make_producer

    try:
        producer = make_producer(bootstrap, **client_settings(cfg.kafka))
        parts = int(cfg.kafka.partitions)
        timeline = sorted([(ev["ts"], 0, ev) for ev in imps] + [(a["ts"], 1, a) for a in acts],
                          key=lambda r: (r[0], r[1]))
        topics = (cfg.join.impressions_topic, cfg.join.actions_topic)
        t0 = time.monotonic()
        for _ts, kind, rec in timeline:
            if stop.is_set():
                break
            rid = rec["request_id"]
            producer.send(topics[kind], orjson.dumps(rec), key=rid.encode(), partition=_partition(rid, parts))
            if kind == 0:
                view.produced += 1
                if rate > 0 and view.produced % 100 == 0:
                    ahead = view.produced / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        stop.wait(ahead)
        producer.flush(60)
        producer.close()
    except Exception as e:  # reported by the main loop
        errors.append(f"producer failed: {e!r}")


def _event_source(cfg: Config, args):
    """Return (batches to produce, list that ends up holding the events to score at the end, list that ends
    up holding their true click probabilities when generated).

    Generated data: the events right after the trained ones (never trained on), ``EVAL_EVENTS`` of them.
    Replayed data: the last events of the file (the file has no held-out part).
    """
    import numpy as np

    from streamrec.ingest import SyntheticStream

    held: list = []
    truth: list = []  # generated data: the generator's click probability of each held-out event
    k = max(args.predict, 1, EVAL_EVENTS)
    if args.data:
        from streamrec.ingest import EventSchema
        from streamrec.ingest.datasets import read_file

        def replay():
            left = args.events or float("inf")
            for b in read_file(args.data, EventSchema.from_sections(cfg.model, cfg.ingest), layout=args.layout):
                if len(b) > left:
                    b = b.take(np.arange(int(left)))
                left -= len(b)
                held[:] = [b.take(np.arange(max(0, len(b) - k), len(b)))]
                yield b
                if left <= 0:
                    break

        return replay(), held, truth

    it = SyntheticStream(cfg).batches(args.events + k, with_truth=True)

    def generated():
        left = args.events
        for b, p in it:
            if len(b) > left:
                held.append(b.take(np.arange(left, len(b))))
                truth.append(p[left:])
                b = b.take(np.arange(left))
            left -= len(b)
            if len(b):
                yield b
            if left <= 0:
                break
        for b, p in it:
            held.append(b)
            truth.append(p)

    return generated(), held, truth


def _produce(cfg: Config, bootstrap: str, batches, rate: float, view: View, stop: threading.Event, errors: list):
    from streamrec.ingest import EventProducer, EventSchema

    try:
        producer = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
        t0 = time.monotonic()
        for b in batches:
            if stop.is_set():
                break
            producer.send_batch(b)
            view.produced += len(b)
            if rate > 0:
                ahead = view.produced / rate - (time.monotonic() - t0)
                if ahead > 0:
                    stop.wait(ahead)
        producer.close()
    except Exception as e:  # reported by the main loop
        errors.append(f"producer failed: {e!r}")


def _held_out_events(cfg: Config, held, k: int) -> list[dict]:
    from streamrec.ingest import EventBatch

    batch = EventBatch.concat(held, cfg.model.dense_dim, cfg.model.field_names)
    events = batch.to_events()[-k:] if held else []
    for ev in events:
        ev.pop("label", None)
    return events


def cmd_demo(args) -> int:
    cfg = config_from_args(args)
    run_dir = Path(args.run_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = demo_config(cfg, args, run_dir)
    cfg_path = save_config(cfg, run_dir / "config.toml")
    err = _console()
    err.print(f"[bold]streamrec demo[/bold] · run directory [cyan]{run_dir}[/cyan]")

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (a background job)
    sup = Supervisor(run_dir / "logs")
    view = View()
    result: dict[str, Any] = {}
    code = 1
    try:
        if args.data:
            _require_events(args.data, cfg, args.layout)
        with kafka_bootstrap(cfg) as bootstrap:
            err.print(f"Kafka at [cyan]{bootstrap}[/cyan]")
            from streamrec.serving import serving_target

            from .logs import startup_line

            startup_line("demo", args, brokers=bootstrap, topics=f"{cfg.kafka.events_topic}, {cfg.kafka.hotset_topic}",
                         ports=f"gRPC {serving_target(cfg.serving)}", device=cfg.trainer.device, data=str(run_dir),
                         source=args.data or f"{args.events:,} generated events at {args.rate:g}/s")
            try:
                result = _run(cfg, cfg_path, bootstrap, args, sup, view, stop, err)
                code = 0
            finally:
                # children drain (final checkpoint, offset commit) while the broker is still up
                stop.set()
                sup.stop_all()
    except KeyboardInterrupt:
        err.print("[yellow]interrupted: stopping every process[/yellow]")
        code = 130
    except DemoFailure as e:
        err.print(f"[red]demo failed:[/red] {e}")
        code = 1
    finally:
        stop.set()
        sup.stop_all()
        leftover = [c.name for c in sup.children if c.poll() is None]
        if leftover:
            err.print(f"[red]could not stop: {leftover}[/red]")
            code = code or 1
    if code == 0:
        _write_report(run_dir, err)
        for i, s in enumerate(result.get("scores", [])):
            print(f"event {i}: score {s:.6f} (model version {result['served_version']})")
        print(json.dumps(result), flush=True)
    else:
        print(json.dumps({"error": "demo failed", "exit_code": code, "run_dir": str(run_dir)}), flush=True)
    return code


def _require_events(path: str, cfg: Config, layout: str) -> None:
    """A data file without one event gives the trainer nothing to train and serving no snapshot: the demo fails
    before it starts a process, rather than after the trainer's idle exit."""
    from streamrec.ingest import EventSchema
    from streamrec.ingest.datasets import read_file

    if not any(len(b) for b in read_file(path, EventSchema.from_sections(cfg.model, cfg.ingest), layout=layout)):
        raise DemoFailure(f"{path} holds no events: nothing to train (an empty file, or a header alone)")


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _check_children(sup: Supervisor, errors: list[str]) -> None:
    if errors:
        raise DemoFailure(errors[0])
    dead = sup.dead()
    if dead:
        c = dead[0]
        raise DemoFailure(
            f"process '{c.name}' (pid {c.pid}) exited with code {c.poll()}; last log lines ({c.log_path}):\n{c.tail()}"
        )


def _run(cfg: Config, cfg_path: Path, bootstrap: str, args, sup: Supervisor, view: View,
         stop: threading.Event, err) -> dict[str, Any]:
    from streamrec.ingest import client_settings
    from streamrec.serving import ServingClient, serving_target
    from streamrec.sketch import HotSetFollower

    deadline = time.monotonic() + args.timeout
    target = serving_target(cfg.serving)
    delayed = getattr(args, "delayed_feedback", False)
    _start_children(cfg, cfg_path, bootstrap, args, sup, view, delayed)
    # a trainer that stops at a count starts beside serving, so the stream meets a trainer that is up, as in
    # production (freshness then measures the pipeline, not its start-up); one with an idle exit (a replayed file)
    # starts once the stream has begun, so the wait for serving never counts as idle
    trainer = None if cfg.trainer.idle_exit_s else _start_trainer(cfg_path, bootstrap, args, sup, view)
    client = ServingClient(target, token=cfg.serving.predict_token)
    _wait_for_serving(client, target, sup, deadline)
    err.print(f"serving endpoint up at [cyan]{target}[/cyan] (no model yet)")

    errors: list[str] = []
    producer, held, truth = _start_producer(cfg, bootstrap, args, view, stop, errors, delayed)
    if trainer is None:
        trainer = _start_trainer(cfg_path, bootstrap, args, sup, view)
    follower = HotSetFollower(bootstrap, cfg.kafka.hotset_topic, security=client_settings(cfg.kafka))
    metrics_path = Path(cfg.trainer.log_path)
    figures = _Figures(view, client, follower, producer, metrics_path, open(metrics_path.parent / "view.jsonl", "a"),
                       delayed, cfg.join.metrics_port)
    view.phase = "streaming + training"
    try:
        with _live(view, args, err) as update:
            _watch_training(trainer, sup, errors, deadline, args.timeout, view, figures.refresh, update,
                            cfg.kafka.dlq_topic)
            _wait_for_final_snapshot(sup, errors, deadline, view, figures.refresh, update)
            view.phase = "scoring held-out events through gRPC Predict"
            update()
    finally:
        follower.close()
        figures.close()

    events = _held_out_events(cfg, held, max(args.predict, 1))
    scores, version = client.predict(events)
    scores = [float(s) for s in scores]
    if not scores or not all(math.isfinite(s) for s in scores):
        raise DemoFailure(f"Predict returned bad scores: {scores}")
    ev = _evaluate(cfg, client, held, truth, args, view, figures.freshness, figures.freshness_event)
    return _result(cfg, view, figures, scores, int(version), ev, delayed)


def _child_args(cfg_path: Path, bootstrap: str, args) -> tuple[list[str], list[str]]:
    """The command of a ``streamrec`` child and the arguments every child gets (its config, the brokers, and the
    demo's own log level and format)."""
    return [sys.executable, "-m", "streamrec"], [
        "--config", str(cfg_path), "--bootstrap", bootstrap,
        "--log-level", str(getattr(args, "log_level", "INFO")), "--log-format", getattr(args, "log_format", "text")]


def _start_children(cfg: Config, cfg_path: Path, bootstrap: str, args, sup: Supervisor, view: View,
                    delayed: bool) -> None:
    """Start serving, the sketch worker(s) and the joiner (with ``delayed``, after creating its topics), each a
    ``streamrec`` child logging as the demo was told to."""
    base, common = _child_args(cfg_path, bootstrap, args)
    view.phase = "starting serving and sketch"
    sup.start("serving", base + ["serve", *common])
    sup.start("sketch", base + ["sketch", *common])
    for i in range(2, cfg.trainer.ranks + 1):  # with a trainer group, as many sketch workers (one app)
        sup.start(f"sketch-{i}", base + ["sketch", *common, "--set", f"sketch.state_dir={cfg.sketch.state_dir}-{i}"])
    if delayed:
        from streamrec.ingest import TopicSpec, client_settings, ensure_topics

        ensure_topics(bootstrap, [TopicSpec(cfg.join.impressions_topic, cfg.kafka.partitions),
                                  TopicSpec(cfg.join.actions_topic, cfg.kafka.partitions)],
                      security=client_settings(cfg.kafka))
        sup.start("join", base + ["join", *common])
        view.join = {}


def _start_trainer(cfg_path: Path, bootstrap: str, args, sup: Supervisor, view: View) -> Child:
    """Start the trainer child. Its idle exit (``trainer.idle_exit_s``) counts from its own start, so a trainer
    with one starts once the stream has begun, or it could end with nothing trained."""
    base, common = _child_args(cfg_path, bootstrap, args)
    view.phase = "starting the trainer"
    return sup.start("trainer", base + ["train", *common], expected_exit=True)


def _wait_for_serving(client: ServingClient, target: str, sup: Supervisor, deadline: float) -> None:
    """Return once serving answers at ``target``; DemoFailure when a child dies or the deadline passes first."""
    import grpc

    while True:
        try:
            client.wait_ready(timeout=0.5)
            return
        except grpc.FutureTimeoutError:
            _check_children(sup, [])
            if time.monotonic() > deadline:
                raise DemoFailure(f"serving did not come up at {target}") from None


def _start_producer(cfg: Config, bootstrap: str, args, view: View, stop: threading.Event, errors: list[str],
                    delayed: bool) -> tuple[threading.Thread, list, list]:
    """The started producer thread (impressions and actions with ``delayed``, else labelled events), the held-out
    batches and their true click probabilities (none for delayed feedback)."""
    if delayed:
        from streamrec.foundation import EventSchema

        imps, acts, held_events = args.delayed
        held, truth = [EventSchema.from_sections(cfg.model, cfg.ingest).batch_from_events(held_events)], []
        producer = threading.Thread(target=_produce_delayed, args=(cfg, bootstrap, imps, acts, args.rate, view, stop,
                                                                  errors), daemon=True, name="producer")
    else:
        batches, held, truth = _event_source(cfg, args)
        producer = threading.Thread(target=_produce, args=(cfg, bootstrap, batches, args.rate, view, stop, errors),
                                    daemon=True, name="producer")
    producer.start()
    return producer, held, truth


@dataclass
class _Figures:
    """The live view's figures, refreshed from the trainer's metrics log, the joiner's metrics (``delayed``),
    the hot set and serving's status, each refresh appended to ``view_log`` (view.jsonl); and the served model's
    ages sampled while the stream is live."""

    view: View
    client: ServingClient
    follower: HotSetFollower
    producer: threading.Thread
    metrics_path: Path
    view_log: IO[str]
    delayed: bool
    join_port: int
    # served model's age while events flow: now minus when its newest event entered Kafka (the record
    # timestamp); the event's own ts is kept beside it (replayed files carry old times: ages of years)
    freshness: list[float] = field(default_factory=list)
    freshness_event: list[float] = field(default_factory=list)

    def refresh(self) -> None:
        view = self.view
        view.metrics = _last_json_line(self.metrics_path) or view.metrics
        if self.delayed:
            view.join = join_figures(self.join_port) or view.join
        hs = self.follower.latest()
        if hs is not None:
            view.hot_version = hs.version
            view.hot_rows = int(sum(len(v) for v in hs.tables.values()))
            view.hot_coverage = float(hs.coverage)
        try:
            self._serving_status()
        except Exception:
            pass
        self.view_log.write(json.dumps({
            "t": time.time(), "produced": view.produced, "hot_version": view.hot_version,
            "hot_rows": view.hot_rows, "hot_coverage": view.hot_coverage,
            "served_version": view.served_version, "freshness_s": view.freshness_s,
            "freshness_event_s": view.freshness_event_s, **({"join": view.join} if self.delayed else {}),
        }) + "\n")
        self.view_log.flush()

    def _serving_status(self) -> None:
        view = self.view
        st = self.client.status()
        if st.get("serving"):
            view.served_version = int(st.get("version", 0))
            view.newest_version = int(st.get("newest_version", 0))
            view.held_reason = str(st.get("held_reason", ""))
            if int(st.get("newest_event_ms", 0)) > 0:  # files without event times have no event-time age
                view.freshness_event_s = float(st.get("freshness_s", 0.0))
            kafka_ms = float((st.get("metrics") or {}).get("newest_kafka_ms", 0.0))
            if kafka_ms > 0:
                view.freshness_s = max(0.0, time.time() - kafka_ms / 1000.0)
            if self.producer.is_alive() or not self.freshness:  # while the stream is live
                if view.freshness_s is not None:
                    self.freshness.append(view.freshness_s)
                if view.freshness_event_s is not None:
                    self.freshness_event.append(view.freshness_event_s)

    def close(self) -> None:
        self.view_log.close()


def _watch_training(trainer: Child, sup: Supervisor, errors: list[str], deadline: float, timeout: float, view: View,
                    refresh, update, dlq_topic: str) -> None:
    """Refresh the view until the trainer exits; DemoFailure when a child dies, the deadline passes or the trainer
    trained no event."""
    while trainer.poll() is None:
        _check_children(sup, errors)
        if time.monotonic() > deadline:
            raise DemoFailure(f"timed out after {timeout:.0f}s (trainer at {view.metrics.get('events', 0)} events)")
        refresh()
        update()
        time.sleep(0.5)
    _check_children(sup, errors)
    refresh()
    if not view.metrics.get("events"):  # no snapshot ever comes: waiting for one ran into --timeout
        raise DemoFailure(f"the trainer exited with no events trained (produced {view.produced:,}; "
                          f"an empty file, or every record dead-lettered to {dlq_topic!r}?)")


def _wait_for_final_snapshot(sup: Supervisor, errors: list[str], deadline: float, view: View, refresh,
                             update) -> None:
    """Refresh the view until serving serves the trainer's last snapshot (or its guard holds it back and serves
    the last promoted one); DemoFailure when a child dies or the deadline passes first."""
    view.phase = "waiting for the final snapshot to be served"
    final_version = view.metrics.get("snapshot_version")
    while True:
        refresh()
        update()
        if view.served_version is not None and (final_version is None or view.served_version >= final_version):
            return
        if view.held_reason and final_version is not None and view.newest_version >= final_version:
            # the guard holds the final version back: Predict answers with the last promoted one
            log.warning("serving holds version %d back (%s): scoring with version %d", view.newest_version,
                        view.held_reason, view.served_version)
            return
        _check_children(sup, errors)
        if time.monotonic() > deadline:
            raise DemoFailure(f"served version {view.served_version} never reached {final_version}")
        time.sleep(0.3)


def _result(cfg: Config, view: View, figures: _Figures, scores: list[float], version: int, ev: dict[str, Any],
            delayed: bool) -> dict[str, Any]:
    """The demo's JSON result: the trainer's last figures, the served version, the freshness medians and the
    served model's scores."""
    m = view.metrics
    return {
        "events_trained": int(m.get("events", 0)),
        "auc": _finite(m.get("auc")),
        "window_auc": _finite(m.get("window_auc")),
        "logloss": _finite(m.get("logloss")),
        "events_scored": int(m.get("events_scored", 0)),  # progressive validation: each scored before training
        "hot_coverage": _finite(view.hot_coverage if view.hot_coverage is not None else m.get("hot_coverage")),
        "served_version": version,
        **({"held_version": view.newest_version, "held_reason": view.held_reason} if view.held_reason else {}),
        "freshness_s_median": _median(figures.freshness),  # since the newest served event entered Kafka
        "freshness_event_s_median": _median(figures.freshness_event),  # since its own ts
        "served_auc": ev.get("served_auc"),
        "bayes_auc": ev.get("bayes_auc"),
        "predict_latency_ms": ev.get("predict_latency_ms"),
        "scores": scores,
        "run_dir": str(Path(cfg.trainer.log_path).parent),
        **({"join": view.join, "join_expected_examples": int(cfg.trainer.max_events)} if delayed else {}),
    }


def _median(xs: list[float]) -> float | None:
    return round(float(sorted(xs)[len(xs) // 2]), 2) if xs else None


def _evaluate(cfg: Config, client, held, truth, args, view: View, freshness, freshness_event) -> dict[str, Any]:
    """Score the held-out events through Predict (AUC, Bayes AUC, latency) into ``evaluation.json``."""
    import numpy as np

    from streamrec.ingest import EventBatch

    from .evaluation import evaluate, write_evaluation

    if not held:
        return {}
    batch = EventBatch.concat(held, cfg.model.dense_dim, cfg.model.field_names)
    probs = np.concatenate(truth) if truth else None
    ev = evaluate(client, batch, probs, held_out=not args.data)
    ev.update(produced=view.produced, produce_rate=args.rate, source=args.data or "generated",
              freshness_s_median=_median(freshness), freshness_event_s_median=_median(freshness_event),
              elapsed_s=round(time.monotonic() - view.started, 1))
    write_evaluation(Path(cfg.trainer.log_path).parent, ev)
    return ev


def _finite(v):
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


class _live:
    """A rich Live table on a terminal, or a log line every few seconds elsewhere."""

    def __init__(self, view: View, args, console):
        self.view = view
        self.console = console
        self.tty = console.is_terminal and not args.no_live
        self._last = 0.0
        self._live = None

    def _table(self):
        from rich.table import Table

        t = Table(title="streamrec demo", show_header=False, min_width=60)
        t.add_column(style="bold")
        t.add_column()
        for k, v in self.view.rows():
            t.add_row(k, v)
        return t

    def update(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
        elif time.monotonic() - self._last > 5:
            self._last = time.monotonic()
            # one unwrapped line per refresh: a log reader greps it whole, whatever the console's width
            self.console.print(" · ".join(f"{k}: {v}" for k, v in self.view.rows()), highlight=False, soft_wrap=True)

    def __enter__(self):
        if self.tty:
            from rich.live import Live

            self._live = Live(self._table(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self.update

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)
        else:
            self._last = 0
            self.update()


def _write_report(run_dir: Path, err) -> None:
    try:
        from .report import write_report

        png, md = write_report(run_dir)
        err.print(f"report: [cyan]{md}[/cyan] and [cyan]{png}[/cyan] (again with: streamrec report {run_dir})")
    except Exception as e:  # the report is a convenience; the demo's result stands
        err.print(f"[yellow]could not write the report: {e}[/yellow]")
