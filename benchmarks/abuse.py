"""An abusive Predict client for ``bench serve``'s isolation figure (``p99_ratio_under_abuse``).

``python -m streamrec.benchmarks.abuse HOST:PORT --threads N`` sends, from N threads and as fast
as the server answers, a rotation of what the serving endpoint must survive:

- ``huge``: one event with 2,000,000 ids (16 MB: over ``serving.max_message_mb``);
- ``ids``: one event with ``serving.max_ids_per_event`` + 1 ids (decoded, then refused);
- ``malformed``: bytes that are not a PredictRequest;
- ``dense``: a dense value of 3e38 (beyond ``ingest.dense_abs_max``);
- ``heavy``: the heaviest request the default limits accept: ``max_ids_per_request`` ids never
  seen in training (each one a store lookup), ``max_ids_per_event`` per event;
- ``health``: not abuse, an empty health check: what a flood of the cheapest call costs.

Every request is serialized once, up front, and sent as raw bytes, so this process spends its
CPU on sending, not on building messages. It runs until stdin closes, then prints one JSON
line: calls per kind and status code. With ``--paused`` it waits for a ``go`` line on stdin;
a ``pause`` line stops it sending and, once no call of its is in flight, it prints ``paused``
(``bench serve`` alternates phases with and without it against the same server).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter

import numpy as np


def requests(cfg) -> dict[str, bytes]:
    """The abusive requests, serialized, for the model ``cfg.model`` describes."""
    from streamrec.serving.pb import pb

    s = cfg.serving
    fields = cfg.model.field_names
    dd = cfg.model.dense_dim
    rng = np.random.default_rng(1)

    def event(ids: dict[str, np.ndarray], dense=None) -> "pb.Event":
        ev = pb.Event(dense=dense if dense is not None else [0.1] * dd)
        for f, v in ids.items():
            ev.sparse[f].ids.extend(v.tolist())
        return ev

    def unseen(n: int) -> np.ndarray:
        return rng.integers(2**50, 2**62, n)

    out = {
        "huge": pb.PredictRequest(events=[event({fields[-1]: unseen(2_000_000)})]),
        "ids": pb.PredictRequest(events=[event({fields[-1]: unseen(s.max_ids_per_event + 1)})]),
        "dense": pb.PredictRequest(events=[event({fields[0]: unseen(1)}, dense=[3e38] * max(1, dd))]),
    }
    per_event = s.max_ids_per_event // len(fields)
    n_events = min(s.max_batch, s.max_ids_per_request // (per_event * len(fields)))
    out["heavy"] = pb.PredictRequest(events=[event({f: unseen(per_event) for f in fields})
                                             for _ in range(n_events)])
    blobs = {k: v.SerializeToString() for k, v in out.items()}
    blobs["malformed"] = b"\x0a\xff\xff\xff\xff\x0f" + bytes(range(256)) * 4
    blobs["health"] = b""  # not abuse: an empty health check, the cheapest call there is (a flood's floor)
    return blobs


class Gate:
    """Sending on (``go``) or off, and how many calls are in flight (``pause`` waits for none)."""

    def __init__(self, going: bool = True):
        self.cond = threading.Condition()
        self.going = going
        self.in_flight = 0

    def enter(self, stop: threading.Event) -> bool:
        with self.cond:
            while not self.going and not stop.is_set():
                self.cond.wait(0.1)
            if stop.is_set():
                return False
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def set(self, going: bool) -> None:
        with self.cond:
            self.going = going
            self.cond.notify_all()
            while not going and self.in_flight:
                self.cond.wait()


def run(target: str, blobs: dict[str, bytes], threads: int, stop: threading.Event, token: str = "",
        gate: Gate | None = None) -> Counter:
    import grpc

    counts: Counter = Counter()
    lock = threading.Lock()
    gate = gate or Gate()
    kinds = list(blobs)
    md = (("authorization", f"Bearer {token}"),) if token else ()

    def loop(i: int) -> None:
        with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            calls = {k: ch.unary_unary("/grpc.health.v1.Health/Check" if k == "health" else
                                       "/streamrec.v1.StreamRec/Predict") for k in kinds}
            n = i
            while gate.enter(stop):
                kind = kinds[n % len(kinds)]
                n += 1
                try:
                    calls[kind](blobs[kind], timeout=30, metadata=md)
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name
                finally:
                    gate.leave()
                with lock:
                    counts[f"{kind}:{code}"] += 1

    ths = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in ths:
        t.start()
    stop.wait()
    for t in ths:
        t.join(35)
    return counts


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamrec.benchmarks.abuse", description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--token", default="")
    ap.add_argument("--config", default=None, help="the server's config (limits, model); default: the defaults")
    ap.add_argument("--kinds", default="", help="comma-separated subset of huge,ids,malformed,dense,heavy,health")
    ap.add_argument("--paused", action="store_true", help="start paused: send after a 'go' line on stdin")
    args = ap.parse_args(argv)
    from streamrec.app.config import load_config

    cfg = load_config(args.config, env={})
    blobs = requests(cfg)
    blobs = {k: blobs[k] for k in (args.kinds.split(",") if args.kinds else ["huge", "ids", "malformed", "dense", "heavy"])}
    print("ready", flush=True)
    stop = threading.Event()
    gate = Gate(going=not args.paused)

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                gate.set(True)
            elif line.strip() == "pause":
                gate.set(False)
                print("paused", flush=True)
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    counts = run(args.target, blobs, args.threads, stop, args.token, gate)
    print(json.dumps(dict(sorted(counts.items()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
