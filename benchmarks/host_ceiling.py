"""``streamrec bench train --host-ceiling``: the most events per second this machine's host can
feed a device, whatever the device.

The trainer's whole pipeline runs from an Arrow backlog held in memory (the record values a
consumer would hand over: decode, FAE hot/cold batching, each step's ids, the store's cold
rows, copies, the step, metrics) with a model whose arithmetic is negligible (``mlp`` with no
hidden layer: one linear map of the pooled embeddings). The trainer's :class:`StageClock`
splits the wall time by stage; the stages that run on a device when there is one (unique,
gather, pooling, forward, backward, the hot rows' and dense updates) are reported apart as
``device_ops_us_per_event``, and ``host_us_per_event`` is the rest: on a device that did the
arithmetic in no time, the host alone would bound the trainer at ``1e6 / host_us_per_event``
events per second. Kafka itself is left out (``bench ingest`` and ``bench e2e`` measure it).

The stream, store and hot set are ``bench train``'s fae set-up (26 Criteo-like fields, Zipf
ids, hot tier <= 5% of the ids, chosen from a sample), with the hot index's compiled probe that a
store on a CUDA device uses (``embedding_store/hot_index.py``) on every machine.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

from .bench_train import bench_config, windows_of

GOAL_HOST_US = 2.0  # host microseconds per event: the host alone could feed >= 500 k events/s
NEGLIGIBLE_MODEL = {"model.architecture": "mlp", "model.bottom_mlp": [], "model.top_mlp": []}


@contextmanager
def pipeline(events: int, ids: int, batch: int, threads: int, device: str, model: dict | None = None,
             events_per_message: int = 1024) -> Iterator:
    """``bench train``'s fae set-up fed from an Arrow backlog, with ``threads`` torch threads, in a temporary
    folder: yields ``(core, decoder, backlog)`` with the hot set applied and the windows that sampled it
    trained (the warm-up); ``backlog`` holds the remaining windows' record values. ``model``: config
    overrides of the model (default: the bench's DLRM). The store is closed and the folder removed after."""
    import torch

    torch.set_num_threads(threads)
    root = tempfile.mkdtemp(prefix="bench-train-pipeline-")
    try:
        store, core, decoder, backlog = _set_up(root, events, ids, batch, torch.device(device), model,
                                                events_per_message)
        try:
            yield core, decoder, backlog
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _set_up(root: str, events: int, ids: int, batch: int, device, model: dict | None, events_per_message: int):
    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import EventSchema, hot_budget, hot_budget_rows
    from streamrec.ingest import Decoder, SyntheticStream, encode_messages
    from streamrec.trainer.core import TrainerCore
    from streamrec.trainer.hotset import SampleHotSource

    cfg = bench_config(root, ids, batch, "fae", model, device=str(device))
    fields = cfg.model.field_names
    window = batch * cfg.trainer.window_batches
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    sample = min(50_000, events // 2)
    backlog = []  # one window's record values at a time, as a poll hands them over
    for w in windows_of(SyntheticStream(cfg), events + sample + window, window, cfg.model.dense_dim, fields):
        backlog.append(list(encode_messages(w, schema, "arrow", events_per_message)))
    decoder = Decoder(schema)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), device)
    store.compiled_index = True  # the hot index a device trainer probes with (hot_index.py), on every machine
    core = TrainerCore(cfg.model, cfg.trainer, store, device, store_cfg=cfg.store, join=cfg.join)
    # FAE's hot set from a sample of the stream's first windows, which then train as the warm-up
    src = SampleHotSource(fields, hot_budget_rows(cfg.hot, cfg.model), sample_events=sample)
    warm, upd = [], None
    while upd is None and len(warm) < len(backlog) - 1:
        w, _ = decoder.decode_many(backlog[len(warm)])
        warm.append(w)
        src.observe(w)
        upd = src.poll()
    if upd is not None:
        core.apply_hot_set(upd.version, upd.tables)
    for w in warm:  # warm-up: allocations, first RocksDB files
        core.feed(w)
    return store, core, decoder, backlog[len(warm):]


def run(events: int, ids: int, batch: int, threads: int = 1, device: str = "cpu") -> dict:
    """Train ``events`` events (after the warm-up) and return the stage split (module doc)."""
    from streamrec.trainer.stage_clock import DEVICE_STAGES, STAGES

    from .common import sync

    with pipeline(events, ids, batch, threads, device, NEGLIGIBLE_MODEL) as (core, decoder, backlog):
        warm_n = core.events
        sync(device)
        clock = core.clock
        clock.reset()
        t0 = time.perf_counter()
        for values in backlog:
            with clock.stage("decode"):
                b, bad = decoder.decode_many(values)
            assert not bad, bad[:3]
            core.feed(b)
        core.flush()
        sync(device)
        wall = time.perf_counter() - t0
        n = core.events - warm_n
        stages = {k: clock.seconds.get(k, 0.0) * 1e6 / n for k in STAGES}
        untimed = wall * 1e6 / n - sum(stages.values())  # the loop's own Python between stages
        host = sum(v for k, v in stages.items() if k not in DEVICE_STAGES) + max(0.0, untimed)
        dev_us = sum(v for k, v in stages.items() if k in DEVICE_STAGES)
        return {
            "events": n, "ids": ids, "batch": batch, "threads": threads, "device": device,
            "host_us_per_event": host, "device_ops_us_per_event": dev_us,
            "wall_us_per_event": wall * 1e6 / n, "host_events_per_s": 1e6 / host if host else float("inf"),
            "stages_us_per_event": {**stages, "untimed": max(0.0, untimed)},
            "hot_fraction": core.hot_events / max(1, core.events), "goal_host_us_per_event": GOAL_HOST_US,
        }


def report(r: dict) -> str:
    st = r["stages_us_per_event"]
    parts = ", ".join(f"{k} {v:.2f}" for k, v in st.items() if v >= 0.005)
    ok = "PASS" if r["host_us_per_event"] <= r["goal_host_us_per_event"] else "FAIL"
    return (f"host ceiling: {r['host_us_per_event']:.2f} us/event on the host "
            f"(goal <= {r['goal_host_us_per_event']:g}: {ok}) -> {r['host_events_per_s']:,.0f} events/s; "
            f"device ops on {r['device']} {r['device_ops_us_per_event']:.2f} us/event; "
            f"hot fraction {r['hot_fraction']:.1%}\n  stages (us/event): {parts}")
