"""One `streamrec demo` run shared by the demo and the metrics tests, scraped while it runs.

A demo is the suite's most expensive step (serving, sketch and trainer processes, a generated stream,
a final snapshot, held-out scoring), so the run that checks every process's Prometheus /metrics page
(tests/e2e/test_metrics_endpoints.py) is also the single-trainer end-to-end run whose result
tests/e2e/test_demo.py checks: the demo is started with metrics ports and a rate slow enough that
its processes are up for a while, scraped twice mid-run, and then left to finish on its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SCRAPED_DEMO_EVENTS = 60_000
# events/s: ~50 s of stream, time to scrape while every process is up (the first scrape waits for the sketch's
# first hot set to reach the trainer, after a group join the embedded broker takes 10-30 s over)
SCRAPED_DEMO_RATE = 1200
# counters the second scrape waits on: each has grown since the first scrape when it is taken
GROWING = (("sketch", "streamrec_sketch_events_consumed"), ("trainer", "streamrec_trainer_events_consumed"))


def demo_cmd(run_dir: Path, bootstrap: str, events: int, tag: str | None = None) -> list[str]:
    """`streamrec demo` on the shared test broker, with topics and groups of its own (named by ``tag``,
    by default unique)."""
    tag = tag or uuid.uuid4().hex[:8]
    return [
        sys.executable, "-m", "streamrec", "demo",
        "--bootstrap", bootstrap, "--events", str(events), "--run-dir", str(run_dir), "--no-live",
        "--timeout", "300",
        "--set", f"kafka.events_topic=demo-{tag}",
        "--set", f"kafka.dlq_topic=demo-{tag}.dlq",
        "--set", f"kafka.hotset_topic=demo-hot-{tag}",
        "--set", f"kafka.trainer_group=demo-trainer-{tag}",
        "--set", f"kafka.sketch_group=demo-sketch-{tag}",
    ]


def scrape(port: int) -> dict[str, tuple[str, dict]]:
    """name -> (type, {(sample name, labels): value}) of one /metrics page."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        out[fam.name] = (fam.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples})
    return out


def value(page, name, sample=None, **labels) -> float:
    samples = page[name][1]
    key = (sample or name, tuple(sorted(labels.items())))
    return samples.get(key, 0.0)


def try_scrape(port):
    try:
        return scrape(port)
    except OSError:
        return None


@dataclass
class ScrapedDemo:
    run_dir: Path
    ports: dict[str, int]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    first: dict = field(default_factory=dict)  # process -> /metrics page once the pipeline is up
    second: dict = field(default_factory=dict)  # the same a trainer metrics interval later
    scrape_error: str | None = None  # why the pages were not scraped (the metrics test fails with it)
    predict_scores: int | None = None  # scores a mid-run Predict of two events returned
    bad_field_code: object = None  # gRPC status of a Predict with a field the model does not have


def run_scraped_demo(bootstrap: str, run_dir: Path) -> ScrapedDemo:
    """Run the demo (one trainer) to its end; scrape every process's /metrics twice while it runs."""
    import grpc

    from streamrec.ingest import free_port
    from streamrec.serving import ServingClient

    ports = {"sketch": free_port(), "trainer": free_port(), "serving": free_port()}
    cmd = demo_cmd(run_dir, bootstrap, SCRAPED_DEMO_EVENTS) + [
        "--rate", str(SCRAPED_DEMO_RATE),
        "--set", f"sketch.metrics_port={ports['sketch']}", "--set", f"trainer.metrics_port={ports['trainer']}",
        "--set", f"serving.metrics_port={ports['serving']}"]
    out = ScrapedDemo(run_dir, ports)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240

        def ready():  # all three up, a model served, a hot set published and applied
            pages = {k: try_scrape(p) for k, p in ports.items()}
            if any(p is None for p in pages.values()):
                return None
            ok = (value(pages["serving"], "streamrec_serving_up") == 1
                  and value(pages["sketch"], "streamrec_sketch_hot_sets_published", "streamrec_sketch_hot_sets_published_total") >= 1
                  and value(pages["trainer"], "streamrec_trainer_hot_set_version") >= 1
                  and value(pages["trainer"], "streamrec_trainer_events_trained", "streamrec_trainer_events_trained_total") > 0)
            return pages if ok else None

        first = None
        while first is None:
            if proc.poll() is not None:
                out.scrape_error = "demo ended before its processes were scraped"
                break
            if time.monotonic() > deadline:
                out.scrape_error = "the pipeline did not come up in time"
                break
            time.sleep(1.0)
            first = ready()
        if first is not None:
            out.first = first
            cfg = tomllib.loads((run_dir / "config.toml").read_text())
            fields = [f["name"] for f in cfg["model"]["fields"]]
            event = {"dense": [0.1] * cfg["model"]["dense_dim"], "sparse": {f: 7 for f in fields}}
            with ServingClient(cfg["serving"]["target"]) as client:
                scores, _ = client.predict([event, event])
                out.predict_scores = len(scores)
                try:  # a field the model does not have
                    client.predict([{"dense": event["dense"], "sparse": {**event["sparse"], "nope": 1}}])
                except grpc.RpcError as e:
                    out.bad_field_code = e.code()
            # the second scrape once the sketch and the trainer have counted more events than at the first
            # (the stream is still being produced), so the metrics test can check that counters move
            grow_deadline = time.monotonic() + 60
            while True:
                pages = {k: try_scrape(p) for k, p in ports.items()}
                gone = [k for k, p in pages.items() if p is None]
                if gone:
                    out.scrape_error = f"{gone} stopped serving /metrics before the second scrape (demo ended too soon?)"
                    break
                if all(value(pages[k], n, n + "_total") > value(first[k], n, n + "_total") for k, n in GROWING):
                    break
                if time.monotonic() > grow_deadline:
                    out.scrape_error = f"the event counters {GROWING} did not grow within 60 s of the first scrape"
                    break
                time.sleep(0.5)
            out.second = pages
        out.stdout, out.stderr = proc.communicate(timeout=420)
        out.returncode = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            out.stdout, out.stderr = proc.communicate(timeout=60)
    return out
