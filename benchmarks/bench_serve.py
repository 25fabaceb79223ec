"""``streamrec bench serve``: Predict latency/throughput over gRPC vs the bare model in-process,
snapshot push-to-serving time, serving-side freshness, and isolation from an abusive client.

The server runs in its own process (``streamrec serve``) so clients and server do
not share a GIL. Baseline, same run: the bare DLRM forward pass in-process on the
same batches with embeddings already pooled; also shown: ``inproc_predict`` (lookups
from the store + forward, the trainer's own scoring path), ``serving path in-process``
(the served version's own lookup + forward, no gRPC) and the gRPC floor (round trips
of an empty Health check; ``floor_<sync|aio>_qps_c<N>``: a health-only sync and grpc.aio
server with 1/4/16 client threads, see ``grpc_floor.py``), so the ratio's gap can be split
into transport and work. Each cell also reports the CPU time the server process and the
client process spend per request (``server_cpu_us``, ``client_cpu_us``): on a shared
2-core box, throughput is bounded by their sum, not by latency.
``grpc_vs_inproc_b512`` = served events/s over bare-forward events/s at batch 512.

``--model NAME`` (or ``all``) measures instead the exported dense program as serving runs it against the
Python module it came from, at batch 512 (``exported_vs_module_b512``; the lowest over the models run).

A serving group (``serving.processes``, ``--processes``, default one per core) is measured at batch 512 against
the one-process server, both with a connection per client thread (a group spreads connections), in two
alternating rounds: ``group_qps_b512``, ``one_own_connections_qps_b512``, ``group_vs_one_b512`` and
``group_vs_bound_b512`` (the issue's ratio for the group; ``grpc_vs_bound_b512`` for the one process).

The one-client batch-64 latency (``p99_ms_b64``) against its floor on this machine: the served path and the
whole Predict handler in-process (no gRPC), back to back (``*_ms_b64_hot``) and with the thread idle for one
empty round trip before each call (``*_ms_b64_idle``), as it is in a one-client ping-pong;
``latency_floor_p99_ms_b64`` = that round trip + the served path's idle p99. ``handler_bound_qps_b512``: the
bound with the whole handler at b512 in place of the served path (it costs ``handler_vs_served_path_b512`` times
the served path, both back to back in-process, measured in alternating chunks), i.e. the most a server running
this handler could reach (``handler_bound_vs_bound_b512`` of the bound).

Isolation (``p99_ratio_under_abuse``): a well-behaved client (batch 64, one thread) measures its
p99 alone and, in alternating phases (see ``isolation``), while an abusive client
(``benchmarks/abuse.py``, its own process, 4 threads) sends
what the server must refuse: events of 2,000,000 ids, over-limit ids, malformed bytes, dense 3e38
(goal <= 3). ``p99_ratio_under_heavy`` is the same with an abuser sending the heaviest requests the
default limits accept, which the server must score.

Freshness here is serving's part: an update is stamped with "now" as its event
time, written as a delta snapshot, pushed, and clients poll Predict until the
served version contains it. The trainer's checkpoint cadence comes on top
(``trainer.checkpoint_every_s``), measured by the trainer's benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from streamrec.foundation import stop_process

from .common import add_device_arg, bench_device, sync
from .serve_lines import line_costs


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _cpu(p) -> float:
    t = p.cpu_times()
    return t.user + t.system


ABUSERS = {  # name -> what the abusive client sends (benchmarks/abuse.py), one kind after another
    "abuse": "huge,ids,malformed,dense",  # the hostile client: 2,000,000 ids, over-limit ids, garbage, 3e38
    "heavy": "heavy",  # the heaviest requests the default limits accept (max_ids_per_request unseen ids)
}


def isolation(target: str, request, seconds: float, env: dict, threads: int = 4, token: str = "",
              abusers: dict[str, str] = ABUSERS, server_pid: int | None = None, rounds: int = 4) -> dict:
    """A well-behaved client's latency (one thread, ``request`` back to back) alone and with each abusive
    client (``benchmarks/abuse.py`` in its own process, ``threads`` threads) running, against the same server.

    The phases alternate: ``rounds`` times alone then with the abuser (``seconds / rounds`` each, so ``seconds``
    of each in all), the abuser paused between (no call of its in flight during an alone phase).
    ``p99_ratio_under_<name>`` = the p99 of its phases with the abuser / the p99 of the alone phases between
    them. Why alternate: on a shared machine the load from other jobs drifts over seconds, so one long alone
    phase then one long abused phase would measure that drift as much as the abuser; alternating short phases
    expose both to the same drift. With ``server_pid``, also the CPU the server (``server_cpu_<phase>``) and the abusive
    client (``abuser_cpu_<name>``) spent per second of each phase."""
    import grpc
    import psutil

    from streamrec.serving import ServingClient

    server = psutil.Process(server_pid) if server_pid else None
    server_cpu = (lambda: _cpu(server)) if server is not None else (lambda: 0.0)
    part = seconds / max(1, rounds)

    def measure(secs: float) -> tuple[list[float], int]:
        lat, errors = [], 0
        with ServingClient(target, timeout=30, token=token) as cl:
            cl.predict_request(request)
            t_end = time.perf_counter() + secs
            while time.perf_counter() < t_end:
                t = time.perf_counter()
                try:
                    cl.predict_request(request)
                except grpc.RpcError:
                    errors += 1
                    continue
                lat.append((time.perf_counter() - t) * 1000)
        return lat, errors

    out: dict = {}
    all_alone, errors, alone_cpu = [], 0, 0.0
    for name, kinds in abusers.items():
        abuser = subprocess.Popen([sys.executable, "-m", "streamrec.benchmarks.abuse", target, "--threads", str(threads),
                                   "--kinds", kinds, "--paused"] + (["--token", token] if token else []),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                  text=True)
        alone, lat, s_cpu, a_cpu = [], [], 0.0, 0.0
        try:
            if abuser.stdout.readline().strip() != "ready":
                raise RuntimeError("the abusive client did not start")
            ab = psutil.Process(abuser.pid)
            for _ in range(max(1, rounds)):
                c0 = server_cpu()
                got, err = measure(part)
                alone_cpu += server_cpu() - c0
                alone += got
                errors += err
                abuser.stdin.write("go\n")
                abuser.stdin.flush()
                time.sleep(0.2)  # its threads connected and sending
                c0, a0 = server_cpu(), _cpu(ab)
                got, err = measure(part)
                s_cpu += server_cpu() - c0
                a_cpu += _cpu(ab) - a0
                lat += got
                errors += err
                abuser.stdin.write("pause\n")
                abuser.stdin.flush()
                if abuser.stdout.readline().strip() != "paused":
                    raise RuntimeError("the abusive client did not pause")
            abuser.stdin.close()
            counts = json.loads(abuser.stdout.readline() or "{}")
            abuser.wait(60)
        finally:
            if abuser.poll() is None:
                abuser.kill()
        all_alone += alone
        p99_alone = _pct(alone, 99)
        out.update({f"p99_ms_alone_{name}": p99_alone, f"p99_ms_under_{name}": _pct(lat, 99),
                    f"p50_ms_under_{name}": _pct(lat, 50), f"qps_under_{name}": len(lat) / seconds,
                    f"p99_ratio_under_{name}": _pct(lat, 99) / p99_alone,
                    f"qps_ratio_under_{name}": len(lat) / max(1, len(alone)), f"abuser_{name}": counts,
                    f"server_cpu_{name}": s_cpu / seconds, f"abuser_cpu_{name}": a_cpu / seconds})
    n = max(1, len(abusers))
    out.update({"p99_ms_alone": _pct(all_alone, 99), "p50_ms_alone": _pct(all_alone, 50),
                "qps_alone": len(all_alone) / (seconds * n), "server_cpu_alone": alone_cpu / (seconds * n),
                "errors": errors})
    return out


class _LocalContext:
    """The little of a gRPC ``ServicerContext`` that ``StreamRecService.Predict`` uses, for calling it in-process."""

    def invocation_metadata(self):
        return ()

    def peer(self):
        return "ipv4:127.0.0.1:1"

    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


def idle_gap_latency(fn, gap_s: float, calls: int) -> dict:
    """p50/p99 (ms) of ``fn()`` called ``calls`` times, the thread idle for ``gap_s`` before each call.

    Why: in a one-client ping-pong the server's thread idles while the reply travels, the client reads it and
    sends the next request; the same work then costs more than back to back (caches and CPU state go cold
    while idle; BENCHMARKS.md, serve, has the figures). ``gap_s = 0`` is the back-to-back (hot) figure."""
    lat = []
    for i in range(calls + 20):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        fn()
        if i >= 20:
            lat.append((time.perf_counter() - t) * 1000)
    return {"p50": _pct(lat, 50), "p99": _pct(lat, 99)}


def predict_cell(target: str, request, clients: int, seconds: float, server_ps: list, me_ps,
                 own_connection: bool = False, warm_s: float = 0.3) -> dict:
    """``clients`` threads sending ``request`` back to back for ``seconds`` after ``warm_s`` of the same, untimed:
    latency percentiles, req/s, errors, and the CPU per request of the server processes ``server_ps`` and of this
    process."""
    import grpc

    from streamrec.serving import ServingClient

    lat: list[list[float]] = [[] for _ in range(clients)]
    stop = threading.Event()
    errors = []

    def run(i):
        with ServingClient(target, timeout=30, own_connection=own_connection) as cl:
            cl.predict_request(request)
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    cl.predict_request(request)
                except grpc.RpcError as e:
                    errors.append(e.code().name)
                    continue
                lat[i].append(time.perf_counter() - t)

    ths = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in ths:
        t.start()
    time.sleep(warm_s)
    for x in lat:
        x.clear()
    t0 = time.perf_counter()
    cpu0 = sum(_cpu(p) for p in server_ps), _cpu(me_ps)
    time.sleep(seconds)
    counts = [len(x) for x in lat]
    el = time.perf_counter() - t0
    cpu1 = sum(_cpu(p) for p in server_ps), _cpu(me_ps)
    stop.set()
    for t in ths:
        t.join(30)
    all_lat = [v * 1000 for x in lat for v in x]
    done_n = max(1, sum(counts))
    return {"p50": _pct(all_lat, 50), "p99": _pct(all_lat, 99), "qps": sum(counts) / el, "errors": len(errors),
            "server_cpu_us": (cpu1[0] - cpu0[0]) / done_n * 1e6, "client_cpu_us": (cpu1[1] - cpu0[1]) / done_n * 1e6}


def start_server(env: dict, device: str = "cpu") -> subprocess.Popen:
    """``streamrec serve`` on a free port in its own process; its first stdout line is the target."""
    return subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--port", "0", "--device", device,
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)


def build_state(cfg, tmp: Path, rows_per_table: int, seed: int = 0, device: torch.device | str = "cpu"):
    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.model import DLRM

    model = DLRM.from_config(cfg.model).to(device).eval()
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                         torch.device(device), path=str(tmp / "trainer-store"))
    rng = np.random.default_rng(seed)
    return model, store, rng


MODELS = ("dlrm", "dcn_v2", "deepfm", "mlp")  # model.architecture's built-ins


def _rate(fn, dense, pooled, seconds: float) -> float:
    """Events/s of ``fn(dense, pooled)``, back to back for about ``seconds``."""
    with torch.no_grad():
        for _ in range(3):
            fn(dense, pooled)
        n, t0 = 0, time.perf_counter()
        while True:
            fn(dense, pooled)
            n += 1
            if time.perf_counter() - t0 >= seconds:
                break
        sync(dense.device)
    return n * len(dense) / (time.perf_counter() - t0)


def exported_vs_module(args, dev) -> int:
    """Scoring throughput at batch 512 of the dense network as serving runs an exported program (the program
    read back from its JSON, frozen by ``scoring_forward``) against the Python module it was exported from
    (eager, as a trainer scores) and against the module as serving runs it when no program comes (frozen), in
    alternating rounds; embedding lookups are the same work on either path and are left out."""
    from streamrec.app.config import load_config
    from streamrec.model import build_model
    from streamrec.serving.version import _strip_input_check, scoring_forward
    from streamrec.snapshot.program import export_dense, load_program

    torch.set_num_threads(1)
    names = list(MODELS) if args.model == "all" else [args.model]
    seconds = 0.1 if args.tiny else 0.5 if args.quick else 2.0
    rounds = 1 if args.tiny else 5
    out: dict = {"models": {}, "batch": 512, "device": str(dev), "rounds": rounds}
    for name in names:
        cfg = load_config(None, {"model.architecture": name}, env={})
        mc = cfg.model
        module = build_model(mc).to(dev).eval()
        exp = export_dense(module.cpu(), mc.dense_dim, mc.pooled_dim, len(mc.tasks))
        module = module.to(dev)
        weights = {k: v.detach().to(dev) for k, v in module.state_dict().items()}
        consts = {k: v.to(dev) for k, v in exp.constants.items()}
        program = _strip_input_check(load_program(exp.program_json, weights, consts))
        served_program = scoring_forward(program, mc, dev)  # as ServedVersion does with a program
        served_module = scoring_forward(module, mc, dev)
        g = torch.Generator().manual_seed(1)
        dense = torch.randn(512, mc.dense_dim, generator=g).to(dev)
        pooled = torch.randn(512, mc.pooled_dim, generator=g).to(dev)
        with torch.no_grad():
            same = torch.equal(served_program(dense, pooled), module(dense, pooled))
        r = {"program": [], "module": [], "module_frozen": []}
        for _ in range(rounds):
            r["program"].append(_rate(served_program, dense, pooled, seconds))
            r["module"].append(_rate(module, dense, pooled, seconds))
            r["module_frozen"].append(_rate(served_module, dense, pooled, seconds))
        med = {k: float(np.median(v)) for k, v in r.items()}
        row = {"program_events_per_s": med["program"], "module_events_per_s": med["module"],
               "module_frozen_events_per_s": med["module_frozen"],
               "exported_vs_module_b512": med["program"] / med["module"],
               "exported_vs_frozen_module_b512": med["program"] / med["module_frozen"],
               "program_frozen": served_program is not program, "scores_equal_module": bool(same),
               "program_bytes": len(exp.program_json)}
        out["models"][name] = row
        print(f"{name:>7}: program as served {med['program']:>10,.0f} events/s  module {med['module']:>10,.0f}  "
              f"(frozen {med['module_frozen']:>10,.0f})  exported/module {row['exported_vs_module_b512']:.2f}x  "
              f"scores equal: {same}", file=sys.stderr if args.json else sys.stdout, flush=True)
    out["exported_vs_module_b512"] = min(r["exported_vs_module_b512"] for r in out["models"].values())
    out["model"] = args.model
    out["goals"] = {"exported_vs_module_b512 >= 0.9": out["exported_vs_module_b512"] >= 0.9}
    if args.json:
        print(json.dumps(out))
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object with the issue's keys")
    ap.add_argument("--seconds", type=float, default=None, help="measuring time per (batch, clients) cell")
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                    help="also measure a serving group of this many processes at batch 512 (1 = skip; default: "
                         "one per core)")
    ap.add_argument("--model", choices=[*MODELS, "all"],
                    help="instead: the exported program as serving runs it against the Python module, at batch "
                         "512, for this model.architecture (all: every built-in): exported_vs_module_b512")
    add_device_arg(ap)
    args = ap.parse_args(argv)
    dev = bench_device(args.device, ap)
    if args.model:
        return exported_vs_module(args, dev)

    from streamrec.benchmarks import grpc_floor
    from streamrec.ingest import SyntheticStream
    from streamrec.snapshot import empty_evidence, rows_batch, write_snapshot
    from streamrec.serving import ServingClient, SnapshotPusher, events_to_request
    from streamrec.serving.pb import pb
    from streamrec.app.config import load_config
    from streamrec.model import embed_batch, predict_batch

    tiny = args.tiny
    quick = args.quick or tiny
    cell_s = args.seconds or (0.15 if tiny else 1.2 if quick else 4.0)
    abuse_s = 0.2 if tiny else 2.0 if quick else 5.0  # per phase of the isolation measure (alone, each abuser, alone again)
    # a smoke run: one alternation per abuser, one round of the group against the one process, the cells' clients
    # warmed for less, the model lines' chunks fewer
    iso_rounds, group_rounds, warm_s = (1, 1, 0.1) if tiny else (4, 2, 0.3)
    rows_per_table = 2_000 if tiny else 20_000 if quick else 200_000
    batches = [1, 64, 512]
    clients = [1, 4, 16]
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    overrides = {"serving.data_dir": str(tmp / "serving"), "store.path": str(tmp / "store"), "serving.port": 0,
                 "serving.push_token": "bench", "hot.budget_rows": 100_000}  # baseline store as hot as serving
    cfg = load_config(None, overrides, env={})
    fields = cfg.model.field_names
    torch.set_num_threads(1)  # same as the server process (OMP_NUM_THREADS=1): stable on a shared 2-core box
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    # the "trainer": model + store with rows for the generator's ids
    model, store, rng = build_state(cfg, tmp, rows_per_table, device=dev)
    stream = SyntheticStream(cfg)
    ev_batch = next(iter(stream.batches(max(batches) * 8)))
    for f in fields:  # rows for every id the events use, plus more up to rows_per_table
        ids = np.unique(ev_batch.sparse[f].values)
        extra = rng.integers(-2**62, 2**62, max(0, rows_per_table - len(ids)))
        ids = np.unique(np.concatenate([ids, extra]).astype(np.int64))
        store.upsert_rows(f, ids, rng.standard_normal((len(ids), cfg.model.embedding_dim)).astype(np.float32) * 0.05)
    # the in-process baseline's store keeps the events' rows hot, as serving does after a full load
    store.set_hot({f: np.unique(ev_batch.sparse[f].values)[: store.hot_capacity_rows // len(fields)] for f in fields})
    all_rows = list(store.changed_rows())
    rows_total = sum(len(b) for b in all_rows)

    # baselines: bare forward (pooled precomputed) and the full in-process predict path
    base = {}
    lookup = lambda f, ids: store.peek(f, ids)  # noqa: E731
    for b in batches:
        sub = ev_batch.take(np.arange(b))
        pooled, _ = embed_batch(sub, fields, lookup, dev)
        dense = torch.from_numpy(sub.dense).to(dev)
        with torch.no_grad():
            model(dense, pooled)
            sync(dev)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < cell_s / 2:
                model(dense, pooled)
                n += 1
            sync(dev)  # the queued forwards count in the time
            fwd = n / (time.perf_counter() - t0)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < cell_s / 2:
            predict_batch(model, sub, fields, lookup, dev)
            n += 1
        base[b] = {"forward_qps": fwd, "predict_qps": n / (time.perf_counter() - t0), "sub": sub}
        say(f"in-process b{b:<4} bare forward {fwd:9.1f} req/s ({fwd * b:10.0f} ev/s)   "
            f"lookup+forward {base[b]['predict_qps']:8.1f} req/s")

    # full snapshot
    snap1 = write_snapshot(tmp / "snap-1", version=1, parent_version=None, kind="full", dense_state=model.state_dict(),
                           rows=all_rows, kafka_offsets={}, metrics={"auc": 0.0}, config_hash=cfg.model_hash(),
                           newest_event_ms=int(time.time() * 1000), model_config=cfg.to_dict()["model"],
                           store_config={"init_scale": cfg.store.init_scale}, evidence=empty_evidence())
    size_mb = sum(p.stat().st_size for p in snap1.iterdir()) / 1e6

    # the serving path in-process: the served version's lookup + forward, no gRPC; the same service (its own
    # data_dir) later times the whole handler in-process too (the one-client latency's floor, below)
    from streamrec.snapshot import verify_snapshot
    from streamrec.serving import ServerSettings
    from streamrec.serving.server import StreamRecService

    inproc = load_config(None, {**overrides, "serving.data_dir": str(tmp / "inproc-serving")}, env={})
    local = StreamRecService(ServerSettings(inproc.serving, inproc.store, inproc.ingest.dense_abs_max), dev)
    local.install(snap1, verify_snapshot(snap1))
    served = local.current
    # what checking a stored version against its install record costs (one sha256 per file, at every start and
    # before each delta on it); files in the page cache, as right after an install: hashing, not disk reads
    verify = [served.verify() for _ in range(3)]
    verify_bytes, verify_s = verify[0][0], float(np.median([s for _, s in verify]))
    say(f"stored-version verification: {len(served.files)} files, {verify_bytes / 1e6:.1f} MB in "
        f"{1000 * verify_s:.1f} ms = {verify_s / (verify_bytes / 1e9):.2f} s per GB")
    for b in batches:
        sub = base[b]["sub"]
        served.predict(sub)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < cell_s / 2:
            served.predict(sub)
            n += 1
        base[b]["serving_path_qps"] = n / (time.perf_counter() - t0)
        say(f"in-process b{b:<4} serving path (memory rows + forward) {base[b]['serving_path_qps']:8.1f} req/s")

    env = dict(os.environ, STREAMREC_SERVING__DATA_DIR=str(tmp / "serving"), STREAMREC_SERVING__PUSH_TOKEN="bench",
               STREAMREC_SERVING__WORKERS="16", OMP_NUM_THREADS="1")  # a handler thread per client at 16 clients:
    # no client of the largest cell waits for a handler thread
    proc = start_server(env, str(dev))
    try:
        target = proc.stdout.readline().strip()
        if not target:
            raise RuntimeError("the server did not start")
        pusher = SnapshotPusher(target, token="bench")
        t0 = time.perf_counter()
        r = pusher.push(snap1)
        full_push_s = time.perf_counter() - t0
        assert r.ok, r
        say(f"full snapshot: {rows_total} rows, {size_mb:.1f} MB, push-to-serving {full_push_s:.2f} s")

        # the transport floor: an empty Health check round trip
        with ServingClient(target, timeout=30) as cl:
            cl.health()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < cell_s / 2:
                cl.health()
                n += 1
            floor_qps = n / (time.perf_counter() - t0)
        say(f"gRPC floor (empty Health check, 1 client): {floor_qps:.1f} req/s, {1000 / floor_qps:.2f} ms round trip")

        # the floor per server kind: a health-only sync (thread pool) and grpc.aio server, 1/4/16 client threads
        floors = {}
        for kind in ("sync", "aio"):
            fproc, ftarget = grpc_floor.start(kind)
            try:
                for c in clients:
                    floors[(kind, c)] = grpc_floor.measure(grpc_floor.health_call(ftarget), c, cell_s / 2)
            finally:
                grpc_floor.stop(fproc)
            say(f"gRPC floor, {kind:4s} server, empty Health check: " + "  ".join(
                f"{c} clients {floors[(kind, c)]:7.1f} req/s" for c in clients))

        # Predict latency / throughput, with the CPU time server and clients spend per request
        import psutil

        server_ps, me_ps = psutil.Process(proc.pid), psutil.Process()
        requests = {b: events_to_request(ev_batch.take(np.arange(b)).to_events()) for b in batches}

        # the payload floor: a batch-512 Predict's request and reply bytes over the same kind of
        # server, raw bytes both ways, no decoding and no work; with its CPU per call
        req512 = requests[512].SerializeToString()
        reply512 = pb.PredictResponse(scores=[0.5] * 512, model_version=1).SerializeToString()
        payload, payload_cpu = {}, {}
        fproc, ftarget = grpc_floor.start("payload", str(len(reply512)))
        try:
            for c in clients:
                cpu = [psutil.Process(fproc.pid)]
                payload[c] = grpc_floor.measure(grpc_floor.payload_call(ftarget, req512), c, cell_s / 2, cpu=cpu)
                payload_cpu[c] = {"client_cpu_us": cpu[0] * 1e6, "server_cpu_us": cpu[1] * 1e6}
        finally:
            grpc_floor.stop(fproc)
        say(f"gRPC payload floor, b512 bytes ({len(req512):,} B in, {len(reply512):,} B out), no work: " + "  ".join(
            f"{c} clients {payload[c]:7.1f} req/s (CPU/call server {payload_cpu[c]['server_cpu_us']:.0f} us "
            f"client {payload_cpu[c]['client_cpu_us']:.0f} us)" for c in clients))
        res = {}
        for b in batches:
            for c in clients:
                res[(b, c)] = predict_cell(target, requests[b], c, cell_s, [server_ps], me_ps, warm_s=warm_s)
                say(f"gRPC b{b:<4} clients {c:<3} p50 {res[(b, c)]['p50']:7.2f} ms  p99 {res[(b, c)]['p99']:7.2f} ms  "
                    f"{res[(b, c)]['qps']:8.1f} req/s ({res[(b, c)]['qps'] * b:9.0f} ev/s)  vs bare forward "
                    f"{res[(b, c)]['qps'] / base[b]['forward_qps']:.3f}x  vs lookup+forward "
                    f"{res[(b, c)]['qps'] / base[b]['predict_qps']:.2f}x  errors {res[(b, c)]['errors']}  "
                    f"CPU/req server {res[(b, c)]['server_cpu_us']:.0f} us client {res[(b, c)]['client_cpu_us']:.0f} us")

        # a serving group (serving.processes) on one port against the one process above, both with a
        # connection per client (a group spreads connections, not requests), in alternating rounds
        group = {}
        if args.processes > 1:
            genv = dict(env, STREAMREC_SERVING__DATA_DIR=str(tmp / "serving-group"),
                        STREAMREC_SERVING__PROCESSES=str(args.processes))
            gproc = start_server(genv, str(dev))
            try:
                gtarget = gproc.stdout.readline().strip()
                if not gtarget:
                    raise RuntimeError("the serving group did not start")
                with SnapshotPusher(gtarget, token="bench") as gp:
                    assert gp.push(snap1).ok
                gps = psutil.Process(gproc.pid)
                group_ps = [gps, *gps.children(recursive=True)]  # the supervisor and its server processes
                for rnd in range(group_rounds):
                    for c in (4, 16):
                        for name, t, ps in (("one", target, [server_ps]), ("group", gtarget, group_ps)):
                            r = predict_cell(t, requests[512], c, cell_s, ps, me_ps, own_connection=True,
                                             warm_s=warm_s)
                            group.setdefault((name, c), []).append(r)
                            say(f"gRPC b512 clients {c:<3} own connections, {name:5s} "
                                f"({args.processes if name == 'group' else 1} processes) round {rnd + 1}: "
                                f"{r['qps']:8.1f} req/s  p99 {r['p99']:7.2f} ms  errors {r['errors']}  "
                                f"CPU/req server {r['server_cpu_us']:.0f} us client {r['client_cpu_us']:.0f} us")
            finally:
                stop_process(gproc, 15)

        # isolation: a well-behaved client (batch 64, one thread) alone and with an abusive client running
        iso = isolation(target, requests[64], abuse_s, env, server_pid=proc.pid, rounds=iso_rounds)
        say(f"isolation, well-behaved client b64: alone p99 {iso['p99_ms_alone']:.2f} ms ({iso['qps_alone']:.0f} req/s); "
            + "; ".join(f"with the {n} client p99 {iso[f'p99_ms_under_{n}']:.2f} ms ({iso[f'qps_under_{n}']:.0f} req/s), "
                        f"p99 ratio {iso[f'p99_ratio_under_{n}']:.2f}" for n in ABUSERS)
            + f"; errors {iso['errors']}; server CPU s/s alone {iso['server_cpu_alone']:.2f}, "
            + ", ".join(f"with {n} {iso[f'server_cpu_{n}']:.2f} (the {n} client's own {iso[f'abuser_cpu_{n}']:.2f})"
                        for n in ABUSERS))
        for n in ABUSERS:
            say(f"  the {n} client's calls: {iso[f'abuser_{n}']}")

        # delta snapshot (1% of rows changed + dense) and freshness
        def delta(version, parent, newest_ms):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            rows = []
            for f in fields:
                ids = np.unique(ev_batch.sparse[f].values)[: max(1, rows_per_table // 100)]
                vec = rng.standard_normal((len(ids), cfg.model.embedding_dim)).astype(np.float32)
                rows.append(rows_batch(f, ids, vec))
            return write_snapshot(tmp / f"snap-{version}", version=version, parent_version=parent, kind="delta",
                                  dense_state=model.state_dict(), rows=rows, kafka_offsets={}, metrics={},
                                  config_hash=cfg.model_hash(), newest_event_ms=newest_ms,
                                  model_config=cfg.to_dict()["model"], evidence=empty_evidence())

        snap2 = delta(2, 1, int(time.time() * 1000))
        t0 = time.perf_counter()
        r = pusher.push(snap2)
        delta_push_s = time.perf_counter() - t0
        assert r.ok, r
        say(f"delta snapshot push-to-serving {delta_push_s:.3f} s")

        fresh = []
        with ServingClient(target) as cl:
            for v in range(3, 5 if tiny else 6 if quick else 8):
                t_event = time.time()
                snap = delta(v, v - 1, int(t_event * 1000))
                done = threading.Event()
                th = threading.Thread(target=lambda s=snap: (pusher.push(s), done.set()), daemon=True)
                th.start()
                deadline = time.time() + 60
                while time.time() < deadline:
                    _, got = cl.predict_request(requests[1])
                    if got >= v:
                        break
                    time.sleep(0.002)
                fresh.append(time.time() - t_event)
                th.join(60)
            st = cl.status()
        freshness_s = float(np.median(fresh))
        # the one-client b64 latency's floor: the same work in-process, back to back and with the thread idle
        # between calls for one empty round trip (what a one-client ping-pong leaves it at the least)
        gap_s = 1.0 / floors[("sync", 1)]
        b64, req64, ctx = base[64]["sub"], requests[64].SerializeToString(), _LocalContext()
        idle = {}
        for name, fn in (("served", lambda: served.predict(b64)), ("handler", lambda: local.Predict(req64, ctx))):
            for gap in (0.0, gap_s):
                idle[(name, gap > 0)] = idle_gap_latency(fn, gap, 30 if tiny else 300 if quick else 1500)
        # the whole handler at b512 against the served path alone, back to back, in alternating chunks (the
        # median chunk of each: both see the same machine): what a server running the handler could reach
        req512_bytes, b512 = requests[512].SerializeToString(), base[512]["sub"]
        chunks: dict[str, list[float]] = {"served": [], "handler": []}
        for _ in range(2 if tiny else 8 if quick else 20):
            for name, fn in (("served", lambda: served.predict(b512)),
                             ("handler", lambda: local.Predict(req512_bytes, ctx))):
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                chunks[name].append((time.perf_counter() - t0) / 10)
        handler_vs_served512 = float(np.median(chunks["handler"]) / np.median(chunks["served"]))
        # model lines: a shadow line and a 50/50 split against one line, the whole handler in-process
        lines = line_costs(tmp, snap1, overrides, dev, requests[512], ctx, 2 if tiny else 15 if quick else 30,
                           warm=1 if tiny else 5)
        say(f"model lines at b512 (whole handler in-process): one line {lines['single_handler_qps_b512']:.1f} "
            f"req/s, with a shadow {lines['shadow_handler_qps_b512']:.1f} ({lines['shadow_vs_single_b512']:.2f}x, "
            f"goal >= 0.55; {lines['shadow_skipped']} not shadow-scored), 50/50 split "
            f"{lines['split_handler_qps_b512']:.1f} ({lines['split_vs_single_b512']:.2f}x, goal >= 0.95)")
        floor_p99_b64 = 1000 * gap_s + idle[("served", True)]["p99"]
        say(f"in-process b64, back to back / idle {1000 * gap_s:.2f} ms (one empty round trip) before each call: "
            f"served path p50 {idle[('served', False)]['p50']:.3f} / {idle[('served', True)]['p50']:.3f} ms, p99 "
            f"{idle[('served', False)]['p99']:.3f} / {idle[('served', True)]['p99']:.3f} ms; the whole handler "
            f"(parse, decode, score, reply) p50 {idle[('handler', False)]['p50']:.3f} / "
            f"{idle[('handler', True)]['p50']:.3f} ms, p99 {idle[('handler', False)]['p99']:.3f} / "
            f"{idle[('handler', True)]['p99']:.3f} ms")
        say(f"serving-side freshness (update stamped -> Predict answers with it): median {freshness_s:.3f} s "
            f"over {len(fresh)}; Status.freshness_s now {st['freshness_s']:.3f}")
        pusher.close()
    finally:
        stop_process(proc, 10)
        local.close()
        store.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    best512 = max(res[(512, c)]["qps"] for c in clients)
    per_call_s = min((d["server_cpu_us"] + d["client_cpu_us"]) / 1e6 for d in payload_cpu.values())
    bound512 = (os.cpu_count() or 1) / (per_call_s + 1.0 / base[512]["serving_path_qps"])
    handler_bound512 = (os.cpu_count() or 1) / (per_call_s + handler_vs_served512 / base[512]["serving_path_qps"])
    out = {
        "device": str(dev),
        "p50_ms_b64": round(res[(64, 1)]["p50"], 3),
        "p99_ms_b64": round(res[(64, 1)]["p99"], 3),
        "qps_b512": round(best512, 2),
        "inproc_qps_b512": round(base[512]["forward_qps"], 2),
        "grpc_vs_inproc_b512": round(best512 / base[512]["forward_qps"], 4),
        "full_push_s": round(full_push_s, 3),
        "delta_push_s": round(delta_push_s, 3),
        "freshness_s": round(freshness_s, 3),
        # checking the stored version against its install record (at start and before each delta on it)
        "verify_ms": round(1000 * verify_s, 3),
        "verify_mb": round(verify_bytes / 1e6, 3),
        "verify_s_per_gb": round(verify_s / (verify_bytes / 1e9), 3),
        "inproc_predict_qps_b512": round(base[512]["predict_qps"], 2),
        "serving_path_inproc_qps_b512": round(base[512]["serving_path_qps"], 2),
        "grpc_floor_qps": round(floor_qps, 2),
        "grpc_vs_inproc_predict_b512": round(best512 / base[512]["predict_qps"], 4),
        **{f"floor_{kind}_qps_c{c}": round(q, 2) for (kind, c), q in floors.items()},
        "floor_best_qps": round(max(floors.values()), 2),
        **{f"floor_payload_qps_b512_c{c}": round(q, 2) for c, q in payload.items()},
        **{f"floor_payload_{k}_b512_c{c}": round(v, 1) for c, d in payload_cpu.items() for k, v in d.items()},
        # the best a server could do here: every core busy, each request costing only the payload
        # floor's CPU per call (least over client counts) plus the served path's own work in-process
        "bound_qps_b512": round(bound512, 2),
        "bound_vs_inproc_b512": round(bound512 / base[512]["forward_qps"], 4),
        "p99_ratio_under_abuse": round(iso["p99_ratio_under_abuse"], 3),
        "p99_ms_alone_b64": round(iso["p99_ms_alone"], 3),
        "p99_ms_under_abuse_b64": round(iso["p99_ms_under_abuse"], 3),
        "qps_ratio_under_abuse": round(iso["qps_ratio_under_abuse"], 3),
        "p99_ratio_under_heavy": round(iso["p99_ratio_under_heavy"], 3),
        "qps_ratio_under_heavy": round(iso["qps_ratio_under_heavy"], 3),
        "p99_ms_under_heavy_b64": round(iso["p99_ms_under_heavy"], 3),
        # each ratio's denominator: the alone phases alternating with that client's phases
        "p99_ms_alone_between_b64": {n: round(iso[f"p99_ms_alone_{n}"], 3) for n in ABUSERS},
        "server_cpu_s_per_s": {k: round(iso[f"server_cpu_{k}"], 3) for k in ("alone", *ABUSERS)},
        "abuser_calls": {n: iso[f"abuser_{n}"] for n in ABUSERS},
        "grpc_vs_bound_b512": round(best512 / bound512, 4),
        # the one-client b64 latency's parts in-process (ms): back to back (hot) and idle one empty round trip
        # before each call; the floor = that round trip + the served path's idle p99 (no decode, no reply)
        **{f"{name}_{q}_ms_b64_{'idle' if gap else 'hot'}": round(v[q], 3) for (name, gap), v in idle.items()
           for q in ("p50", "p99")},
        "latency_floor_p99_ms_b64": round(floor_p99_b64, 3),
        # the bound again with the whole handler (parse, decode, merge, score, reply) in place of the served
        # path, both at their back-to-back cost: the most a server running this handler could reach here
        "handler_vs_served_path_b512": round(handler_vs_served512, 4),
        "handler_bound_qps_b512": round(handler_bound512, 2),
        "handler_bound_vs_bound_b512": round(handler_bound512 / bound512, 4),
        # model lines (serve_lines.py): a shadow line / a 50/50 split against one line, the handler in-process
        "shadow_vs_single_b512": round(lines["shadow_vs_single_b512"], 4),
        "split_vs_single_b512": round(lines["split_vs_single_b512"], 4),
        **{k: round(v, 2) for k, v in lines.items() if k.endswith("handler_qps_b512")},
        "shadow_skipped": lines["shadow_skipped"],
        "errors": sum(v["errors"] for v in res.values()) + sum(r["errors"] for v in group.values() for r in v),
        "cells": {f"b{b}_c{c}": {k: round(x, 3) for k, x in v.items()} for (b, c), v in res.items()},
    }
    if group:  # the best round of each, and the group against the one process measured the same way
        one = max(r["qps"] for (n, _), v in group.items() if n == "one" for r in v)
        grp = max(r["qps"] for (n, _), v in group.items() if n == "group" for r in v)
        out.update({
            "group_processes": args.processes,
            "one_own_connections_qps_b512": round(one, 2),
            "group_qps_b512": round(grp, 2),
            "group_vs_one_b512": round(grp / one, 4),
            "group_grpc_vs_inproc_b512": round(grp / base[512]["forward_qps"], 4),
            "group_vs_bound_b512": round(grp / bound512, 4),
            "group_cells": {f"{n}_b512_c{c}": [{k: round(x, 3) for k, x in r.items()} for r in v]
                            for (n, c), v in group.items()},
        })
        say(f"serving group at b512: {args.processes} processes {grp:.0f} req/s vs one process {one:.0f} req/s "
            f"(both with a connection per client) = {grp / one:.2f}x; {grp / bound512:.2f} of the bound "
            f"(one process, shared connection: {best512 / bound512:.2f})")
    say(f"best empty-call floor {out['floor_best_qps']:.0f} req/s vs best Predict b512 {best512:.0f} req/s and "
        f"the bare forward b512 {base[512]['forward_qps']:.0f} req/s: the floor alone is "
        f"{out['floor_best_qps'] / base[512]['forward_qps']:.2f}x the forward")
    say(f"bound at b512: {os.cpu_count()} cores / (payload floor CPU per call + served path in-process) = "
        f"{bound512:.0f} req/s = {out['bound_vs_inproc_b512']:.2f}x the bare forward")
    say(f"with the whole handler in place of the served path (it costs {handler_vs_served512:.2f}x the served path back "
        f"to back): {handler_bound512:.0f} req/s = {handler_bound512 / bound512:.2f} of the bound")
    say(f"p99_ratio_under_abuse: {out['p99_ratio_under_abuse']} (goal <= 3); under the heaviest legal requests: "
        f"{out['p99_ratio_under_heavy']}")
    say(f"p99 at batch 64 (1 client): {out['p99_ms_b64']} ms (goal <= 2; the first goal <= 10) against a "
        f"floor of {floor_p99_b64:.2f} ms (one empty round trip + the served path's p99 when idle between calls)")
    say(f"served/in-process forward at b512: {out['grpc_vs_inproc_b512']}x (goal >= 0.5); vs lookup+forward "
        f"{out['grpc_vs_inproc_predict_b512']}x")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
