"""``streamrec bench fuzz``: mutated records through the decoder, in a child process: none may escape.

Workload: valid Arrow IPC messages (1, 16 and 512 events of the default model,
request ids included; and 16 events ZSTD-compressed) and valid JSON events (int and string ids) from the
synthetic stream, then, per input, one of: 1-4 bytes of a valid Arrow message
flipped, inserted, deleted, overwritten or the message truncated (45%); the same
to a valid JSON message (35%); arbitrary bytes, some behind a ``{`` or an Arrow
continuation marker (10%); a JSON event with one hostile value (lone
surrogates as ``\\ud800`` escapes and as bytes ED A0 80, NaN/inf/3e38 dense
values, deep nesting, wrong types; 10%). Input ``i`` of seed ``s`` is always the
same, so a finding is reproduced by ``--seed s`` (the report names ``i``).

Each input goes through ``Decoder.decode`` in a child process and counts as
valid (an EventBatch whose invariants hold), refused (EventError), an other
exception (a containment bug: must be 0) or a crash (the child died: must be 0;
the parent starts a new child after the input that killed it). The baseline,
measured in the same child before the fuzzing, is decoding the valid messages
themselves in the same Arrow/JSON mix: ``mutated_vs_valid`` is the ratio of
messages decoded per second (refusing a broken record must not cost more than
decoding a good one). ``slowest_ms`` is the longest single decode. ``--json``
makes the last stdout line one JSON object. Exit status 1 when anything
escaped or crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

CHILD_MODULE = "streamrec.benchmarks.bench_fuzz"
PROGRESS_EVERY = 1000  # the child reports its counts this often (what a crash would otherwise lose)
HOSTILE = ["\ud800", "a\udfffb", float("nan"), float("inf"), 3e38, -3e38, 2**64, "x", None, True, {"a": 1}, [1, [2]]]


# -- the inputs (the same in every process for a seed) ------------------------------


def _seeds():
    """Valid messages: (Arrow messages, JSON messages, JSON events) and the schema they are valid for."""
    import numpy as np
    import pyarrow as pa

    from streamrec.app.config import load_config
    from streamrec.ingest import EventSchema, SyntheticStream, encode_arrow, encode_json
    from streamrec.ingest.codec import batch_to_arrow

    cfg = load_config(None, {}, env={})  # the default model: 4 sparse fields (one multi-valued), dense 4
    schema = EventSchema.from_sections(cfg.model, cfg.ingest)
    b = next(SyntheticStream(cfg, chunk=512).batches(512))
    b.request_ids = [f"req-{i}" if i % 4 else None for i in range(len(b))]
    arrow = [encode_arrow(b.take(np.arange(k)), schema) for k in (1, 16, 512)]
    rb = batch_to_arrow(b.take(np.arange(16)), schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(rb)
    arrow.append(sink.getvalue().to_pybytes())  # a third party's compressed record batch
    events = b.take(np.arange(8)).to_events()
    events.append({**events[0], "sparse": {**events[0]["sparse"], "user": "alice", "tags": ["a", "ü", 3]},
                   "request_id": "r-ü"})
    return arrow, [encode_json(ev) for ev in events], events, schema


def _mutate(rng: random.Random, value: bytes) -> bytes:
    v = bytearray(value)
    for _ in range(rng.randint(1, 4)):
        if not v:
            break
        op, i = rng.randrange(5), rng.randrange(len(v))
        if op == 0:
            v[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            v.insert(i, rng.randrange(256))
        elif op == 2:
            del v[i]
        elif op == 3:
            v[i] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif i:
            del v[i:]
    return bytes(v)


def _hostile(rng: random.Random, events: list) -> bytes:
    ev = json.loads(json.dumps(rng.choice(events)))
    where = rng.choice(["ts", "label", "dense", "user", "tags", "request_id", "nest"])
    value = rng.choice(HOSTILE)
    if where == "dense":
        ev["dense"][rng.randrange(len(ev["dense"]))] = value
    elif where in ("user", "tags"):
        ev["sparse"][where] = [value] if rng.random() < 0.5 else value
    elif where == "nest":
        d = rng.choice((10, 500, 5000, 50_000))
        return json.dumps(ev)[:-1].encode() + b', "request_id": ' + b"[" * d + b"]" * d + b"}"
    else:
        ev[where] = value
    if rng.random() < 0.5:
        return json.dumps(ev).encode()  # lone surrogates as "\ud800" escapes, NaN/Infinity literals
    return json.dumps(ev, ensure_ascii=False).encode("utf-8", "surrogatepass")  # ... as bytes ED A0 80


def make_input(seed: int, i: int, arrow: list, js: list, events: list) -> tuple[str, bytes]:
    """Input ``i`` of ``seed``: (kind, bytes)."""
    rng = random.Random(seed * 1_000_003 + i)
    r = rng.random()
    if r < 0.45:
        return "arrow", _mutate(rng, rng.choice(arrow))
    if r < 0.80:
        return "json", _mutate(rng, rng.choice(js))
    if r < 0.90:
        raw = rng.randbytes(rng.randrange(300))
        return "bytes", rng.choice((b"", b"{", b"\xff\xff\xff\xff")) + raw
    return "hostile", _hostile(rng, events)


def _check(b, schema) -> None:
    """The invariants of a decoded batch (what the trainer and the sketch rely on)."""
    import numpy as np

    n = len(b)
    assert b.ts.dtype == np.int64 and b.ts.shape == (n,)
    assert b.labels.dtype == np.float32 and b.labels.shape == (n,) and bool(np.all((b.labels >= 0) & (b.labels <= 1)))
    assert b.dense.dtype == np.float32 and b.dense.shape == (n, schema.dense_dim)
    assert bool(np.all(np.abs(b.dense) <= schema.dense_abs_max))
    for j in b.sparse.values():
        assert j.values.dtype == np.int64 and len(j.offsets) == n + 1 and j.offsets[0] == 0
        assert j.offsets[-1] == len(j.values) and bool(np.all(np.diff(j.offsets) >= 0))
    assert b.request_ids is None or (len(b.request_ids) == n and all(
        r is None or r.encode("utf-8") is not None for r in b.request_ids))


# -- the child ----------------------------------------------------------------------


def child(seed: int, start: int, stop: int, skip: list[int], baseline: int, progress: str) -> None:
    """Decode inputs ``start``..``stop`` (but ``skip``); print a JSON line of counts every PROGRESS_EVERY
    inputs and at the end. Before each decode the input's index is written to ``progress``."""
    from streamrec.ingest import Decoder, EventError

    arrow, js, events, schema = _seeds()
    dec = Decoder(schema)
    out = {"start": start}
    if baseline:  # the valid messages themselves, in the fuzz's Arrow/JSON mix
        valid = [arrow[k % len(arrow)] if k % 20 < 9 else js[k % len(js)] for k in range(baseline)]
        for v in valid[:50]:
            dec.decode(v)  # warm: imports, the schema seen once
        t0 = time.perf_counter()
        for v in valid:
            dec.decode(v)
        out.update(valid_msgs=baseline, valid_s=time.perf_counter() - t0, valid_bytes=sum(map(len, valid)))
    counts = {"tried": 0, "valid": 0, "event_error": 0, "other": 0, "bad_batch": 0}
    kinds: dict[str, int] = {}
    others: list = []
    spent = nbytes = slowest = 0.0
    slowest_at = -1
    skip_set = set(skip)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o600)
    perf = time.perf_counter

    def report(next_input: int) -> None:  # the counts of start..next_input, cumulative
        out.update(next=next_input, counts=counts, kinds=kinds, others=others[:20], spent=spent, bytes=nbytes,
                   slowest=slowest, slowest_at=slowest_at)
        print(json.dumps(out), flush=True)

    for i in range(start, stop):
        if i in skip_set:
            continue
        kind, v = make_input(seed, i, arrow, js, events)
        os.pwrite(fd, i.to_bytes(8, "little"), 0)
        t0 = perf()
        try:
            b = dec.decode(v)
            dt = perf() - t0
            try:
                _check(b, schema)
                counts["valid"] += 1
            except AssertionError:
                counts["bad_batch"] += 1
                others.append([i, kind, "batch invariants"])
        except EventError:
            dt = perf() - t0
            counts["event_error"] += 1
        except Exception as e:  # containment bug
            dt = perf() - t0
            counts["other"] += 1
            others.append([i, kind, f"{type(e).__name__}: {str(e)[:120]}"])
        counts["tried"] += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        spent += dt
        nbytes += len(v)
        if dt > slowest:
            slowest, slowest_at = dt, i
        if (i + 1) % PROGRESS_EVERY == 0:
            report(i + 1)
    report(stop)
    os.close(fd)


# -- the parent ---------------------------------------------------------------------


def run(n: int, seed: int, baseline: int, timeout_s: float = 300.0) -> dict:
    """Fuzz inputs 0..n of ``seed`` in child processes; a child that dies is replaced after the input
    that killed it. Returns the merged counts."""
    total = {"tried": 0, "valid": 0, "event_error": 0, "other": 0, "bad_batch": 0}
    kinds: dict[str, int] = {}
    others: list = []
    crashes: list = []
    spent = nbytes = slowest = 0.0
    slowest_at = -1
    valid = None
    start, skip = 0, []
    with tempfile.TemporaryDirectory(prefix="streamrec-fuzz-") as d:
        progress = os.path.join(d, "progress")
        while start < n:
            code = (f"import faulthandler; faulthandler.enable(); from {CHILD_MODULE} import child; "
                    f"child({seed}, {start}, {n}, {skip!r}, {baseline if valid is None else 0}, {progress!r})")
            with open(progress, "wb") as f:
                f.write((start - 1).to_bytes(8, "little", signed=True))
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                stdout, stderr = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            last = None
            for line in stdout.splitlines():
                if line.startswith("{"):
                    last = json.loads(line)
            if last is not None:
                for k in total:
                    total[k] += last["counts"][k]
                for k, v in last["kinds"].items():
                    kinds[k] = kinds.get(k, 0) + v
                others += last["others"]
                spent += last["spent"]
                nbytes += last["bytes"]
                if last["slowest"] > slowest:
                    slowest, slowest_at = last["slowest"], last["slowest_at"]
                if valid is None and "valid_msgs" in last:
                    valid = (last["valid_msgs"], last["valid_s"], last["valid_bytes"])
            if p.returncode == 0 and last is not None and last["next"] >= n:
                break
            # died (or hung): the input it was decoding is a crash; go on after it, from the last counts
            with open(progress, "rb") as f:
                at = int.from_bytes(f.read(8), "little", signed=True)
            resume = last["next"] if last is not None else start
            if at < resume:  # died before decoding anything new: a broken setup, not an input
                raise RuntimeError(f"fuzz child exited {p.returncode} before decoding input {resume}: {stderr[-2000:]}")
            crashes.append({"input": at, "exit": p.returncode, "stderr": stderr[-600:]})
            start, skip = resume, skip + [at]
    return {"total": total, "kinds": kinds, "others": others, "crashes": crashes, "spent": spent,
            "bytes": nbytes, "slowest": slowest, "slowest_at": slowest_at, "valid": valid}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200k inputs instead of 2M (well under 60 s)")
    ap.add_argument("--inputs", type=int, default=0, help="inputs to try (overrides --quick)")
    ap.add_argument("--seed", type=int, default=None, help="which inputs (default: a fresh one, printed)")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    ap.add_argument("--tiny", action="store_true", help="a smoke run (seconds): checks the bench works, its figures mean little")
    args = ap.parse_args(argv or [])
    n = args.inputs or (2_000 if args.tiny else 200_000 if args.quick else 2_000_000)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    baseline = min(n, 20_000)
    t_start = time.perf_counter()
    r = run(n, seed, baseline)
    t = r["total"]
    vn, vs, vb = r["valid"] or (0, 0.0, 0)
    fuzz_rate = t["tried"] / r["spent"] if r["spent"] else 0.0
    valid_rate = vn / vs if vs else 0.0
    out = {
        "inputs": t["tried"] + len(r["crashes"]),
        "valid": t["valid"],
        "event_error": t["event_error"],
        "other_exceptions": t["other"] + t["bad_batch"],
        "crashes": len(r["crashes"]),
        "mutated_msgs_per_s": round(fuzz_rate),
        "valid_msgs_per_s": round(valid_rate),
        "mutated_vs_valid": round(fuzz_rate / valid_rate, 3) if valid_rate else None,
        "mutated_mb_per_s": round(r["bytes"] / r["spent"] / 1e6, 1) if r["spent"] else 0.0,
        "valid_mb_per_s": round(vb / vs / 1e6, 1) if vs else 0.0,
        "slowest_ms": round(r["slowest"] * 1e3, 2),
        "slowest_input": r["slowest_at"],
        "kinds": r["kinds"],
        "seed": seed,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    print(f"fuzz benchmark ({'quick' if args.quick and not args.inputs else 'full'}; seed {seed}; child process; "
          f"default model): {out['inputs']:,} inputs "
          f"({', '.join(f'{k} {v:,}' for k, v in sorted(r['kinds'].items()))})")
    print(f"  decoded valid {out['valid']:,}, refused (EventError) {out['event_error']:,}, "
          f"other exceptions {out['other_exceptions']} (must be 0), crashes {out['crashes']} (must be 0)")
    print(f"  decode of mutated inputs {out['mutated_msgs_per_s']:,} msgs/s ({out['mutated_mb_per_s']} MB/s) vs "
          f"valid messages {out['valid_msgs_per_s']:,} msgs/s ({out['valid_mb_per_s']} MB/s, baseline, same child): "
          f"ratio {out['mutated_vs_valid']}")
    print(f"  slowest single decode {out['slowest_ms']} ms (input {out['slowest_input']}); took {out['seconds']} s")
    for o in r["others"][:10]:
        print(f"  ESCAPED: input {o[0]} ({o[1]}): {o[2]}")
    for c in r["crashes"][:10]:
        print(f"  CRASH: input {c['input']} (exit {c['exit']}): {c['stderr'][-300:]}")
    if args.json:
        print(json.dumps(out))
    return 1 if out["other_exceptions"] or out["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
