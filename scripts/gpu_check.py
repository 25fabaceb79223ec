"""Run the CUDA checks and write one JSON summary (driven by scripts/gpu_check.sh).

Steps, each bounded in time and recorded whatever happens to the others:

1. the machine: Python, torch and its CUDA build, the device's name and memory;
2. the CUDA tests (``tests/gpu`` and every test marked ``gpu``) on ``STREAMREC_TEST_DEVICE``;
3. the benches of ``BENCHES`` on the device, each with ``--json``: ``bench train`` at batch 2048 and
   8192 (in-memory, FAE, all-in-store), its ``--host-ceiling`` and ``--device-busy`` (torch.profiler:
   the share of the wall time the GPU is busy), ``bench e2e --arrow-backlog`` (Kafka Arrow backlog to a
   trained model, at the batch of the 1 M events/s goal); ``bench store`` and ``bench serve`` when named in
   ``--benches``;
4. ``goals``: the GPU goals read off those results, each with its figure and PASS/FAIL.

The summary's ``ok`` is true only when every test passed (none failed, none errored, none skipped)
and every bench exited 0 with a JSON result (a missed goal is reported, not a failed check). ``--dry-run`` runs the same steps on the CPU at the
benches' smallest size, so this script and the tests it drives run in the suite on machines without
a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = {  # name: the bench command's arguments (``--quick`` becomes ``--tiny`` in a dry run)
    "train": ["train", "--quick"],
    "train_b8192": ["train", "--quick", "--batch", "8192"],
    "host_ceiling": ["train", "--quick", "--host-ceiling"],
    "device_busy": ["train", "--quick", "--device-busy"],
    "e2e_arrow": ["e2e", "--quick", "--arrow-backlog", "--batch", "8192"],
    "store": ["store", "--quick"],
    "serve": ["serve", "--quick"],
}
DEFAULT_BENCHES = ("train", "train_b8192", "host_ceiling", "device_busy", "e2e_arrow")
TEST_PATHS = ("tests/gpu", "tests/store/test_reference_model.py")


def machine(python: str, device: str) -> dict:
    code = (
        "import json, platform, torch\n"
        "d = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda_build': torch.version.cuda,\n"
        "     'cuda_available': torch.cuda.is_available()}\n"
        "if torch.cuda.is_available():\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    d.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count())\n"
        "print(json.dumps(d))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or ["torch does not import"], "device": device}
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d["device"] = device
    return d


def run_tests(python: str, device: str, out_dir: Path, timeout_s: int) -> dict:
    junit = out_dir / "gpu-tests.xml"
    env = {**os.environ, "STREAMREC_TEST_DEVICE": device}
    cmd = [python, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "-rfEs", "--strict-markers",
           "-m", "gpu", f"--junitxml={junit}", *TEST_PATHS]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = -1, f"timed out after {timeout_s} s\n" + ((e.stdout or b"")[-3000:].decode(errors="replace")
                                                             if isinstance(e.stdout, bytes) else str(e.stdout or ""))
    (out_dir / "gpu-tests.log").write_text(tail)
    result = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "passed": 0, "failed": 0, "errors": 0,
              "skipped": 0, "cases": {}}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name')}"
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = tag
                    result["cases"][name] = {"outcome": tag, "message": (el.get("message") or "")[:500],
                                             "seconds": float(case.get("time", 0))}
                    break
            if outcome == "passed":
                result["cases"][name] = {"outcome": "passed", "seconds": float(case.get("time", 0))}
            key = {"failure": "failed", "error": "errors"}.get(outcome, outcome)
            result[key] += 1
    if rc != 0 and not result["cases"]:
        result["log_tail"] = tail[-2000:]
    return result


def run_bench(python: str, args: list[str], device: str, timeout_s: int) -> dict:
    cmd = [python, "-m", "streamrec", "bench", *args, "--json", "--device", device]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"rc": -1, "seconds": timeout_s, "error": f"timed out after {timeout_s} s", "command": " ".join(cmd[2:])}
    d: dict = {"rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "command": " ".join(cmd[2:])}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                d["result"] = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if proc.returncode != 0 or "result" not in d:
        d["error"] = (proc.stderr or proc.stdout)[-2000:]
    return d


def goals(benches: dict) -> list[dict]:
    """The GPU goals, each ``{goal, figure, status}``; a goal whose bench gave no result is ``not run``."""
    res = {k: b.get("result") for k, b in benches.items()}
    out = []

    def goal(text: str, need: tuple[str, ...], figure, ok) -> None:
        if not all(res.get(k) for k in need):
            out.append({"goal": text, "figure": None, "status": "not run"})
            return
        out.append({"goal": text, "figure": figure(), "status": "PASS" if ok() else "FAIL"})

    t, t8 = res.get("train") or {}, res.get("train_b8192") or {}
    goal("in-memory >= 1 M events/s at batch 8192", ("train_b8192",),
         lambda: round(t8["memory_events_per_s"]), lambda: t8["memory_events_per_s"] >= 1e6)
    goal("held-out AUC at batch 8192 within 0.002 of batch 2048's (in-memory)", ("train", "train_b8192"),
         lambda: round(t8["auc_memory"] - t["auc_memory"], 4), lambda: abs(t8["auc_memory"] - t["auc_memory"]) <= 0.002)
    for k, r in (("batch 2048", t), ("batch 8192", t8)):
        key = "train" if r is t else "train_b8192"
        goal(f"FAE >= 1.0x in-memory ({k})", (key,), lambda r=r: round(r["fae_vs_memory"], 3),
             lambda r=r: r["fae_vs_memory"] >= 1.0)
        goal(f"FAE >= 3x all-in-store ({k})", (key,), lambda r=r: round(r["fae_vs_cold"], 3),
             lambda r=r: r["fae_vs_cold"] >= 3.0)
        goal(f"|AUC FAE - in-memory| <= 0.002 ({k})", (key,), lambda r=r: round(r["auc_fae"] - r["auc_memory"], 4),
             lambda r=r: abs(r["auc_fae"] - r["auc_memory"]) <= 0.002)
    hc, busy, e2e = res.get("host_ceiling") or {}, res.get("device_busy") or {}, res.get("e2e_arrow") or {}
    goal("host ceiling <= 2 us/event", ("host_ceiling",), lambda: round(hc["host_us_per_event"], 2),
         lambda: hc["host_us_per_event"] <= 2.0)
    goal("GPU busy >= 60% of the wall time", ("device_busy",), lambda: busy["device_busy_share"],
         lambda: (busy["device_busy_share"] or 0.0) >= 0.6)
    goal("Kafka Arrow backlog to trained >= 500 k events/s (batch 8192)", ("e2e_arrow",),
         lambda: round(e2e["train_arrow_backlog_events_per_s"]), lambda: e2e["train_arrow_backlog_events_per_s"] >= 5e5)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, smallest bench sizes: checks this script itself")
    p.add_argument("--out", default=None, help="folder for the summary and logs (default: $OUT, else runs/gpu_check)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs tests and benches")
    p.add_argument("--benches", default=",".join(DEFAULT_BENCHES),
                   help=f"comma-separated names of {', '.join(BENCHES)} ('' for none)")
    p.add_argument("--test-timeout", type=int, default=240)
    p.add_argument("--bench-timeout", type=int, default=150)
    args = p.parse_args(argv)

    device = "cpu" if args.dry_run else "cuda"
    unknown = [b for b in args.benches.split(",") if b and b not in BENCHES]
    if unknown:
        p.error(f"unknown bench {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "runs" / "gpu_check")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    summary: dict = {"dry_run": args.dry_run, "machine": machine(args.python, device)}
    print(f"gpu_check: {json.dumps(summary['machine'])}", file=sys.stderr, flush=True)
    if not args.dry_run and not summary["machine"].get("cuda_available"):
        summary.update(ok=False, reason="CUDA is not available to this Python; --dry-run checks the script on CPU")
    else:
        summary["tests"] = run_tests(args.python, device, out_dir, args.test_timeout)
        t = summary["tests"]
        print(f"gpu_check: tests {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
              f"{t['skipped']} skipped ({t['seconds']} s)", file=sys.stderr, flush=True)
        summary["benches"] = {}
        for name in [b for b in args.benches.split(",") if b]:
            cmd = [("--tiny" if a == "--quick" and args.dry_run else a) for a in BENCHES[name]]
            summary["benches"][name] = r = run_bench(args.python, cmd, device, args.bench_timeout)
            print(f"gpu_check: bench {name} rc={r['rc']} ({r['seconds']} s)", file=sys.stderr, flush=True)
        tests_ok = t["rc"] == 0 and t["passed"] > 0 and t["failed"] == t["errors"] == t["skipped"] == 0
        summary["ok"] = tests_ok and all(b["rc"] == 0 and "result" in b for b in summary["benches"].values())
        summary["goals"] = goals(summary["benches"])
        for g in summary["goals"]:
            print(f"gpu_check: goal {g['status']}: {g['goal']} ({g['figure']})", file=sys.stderr, flush=True)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(summary, indent=1))
    print(json.dumps({"ok": summary["ok"], "summary": str(path), "seconds": summary["seconds"]}))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
