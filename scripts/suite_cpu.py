"""Where a test run's CPU goes: run pytest (by default with the README's test command's arguments, without the
set-up) and sample it and every process below it twice a second; at the end, print the run's wall time, the CPU
seconds its processes used by kind (pytest workers, group ranks, `streamrec <command>` children, the broker, ...)
and that total against what the machine's cores could give over the wall time.

    .venv/bin/python scripts/suite_cpu.py                       # the suite
    .venv/bin/python scripts/suite_cpu.py -- -m "not e2e" -n 2  # other pytest arguments

The sampler sees a process only while it lives through a sample and while it is below pytest (one whose parent
exited first is seen only if a sample caught it before): the figures are lower bounds, short-lived processes (a
`streamrec config` call) mostly missed. A process's kind is read from its first command line seen; an exited
process whose command line was never read counts as "unknown".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import psutil

KINDS = (  # (kind, pattern of the command line), first match wins
    ("broker (tansu)", r"tansu"),
    ("group fork server and ranks", r"multiprocessing\.forkserver|from multiprocessing"),
    ("pytest worker", r"execnet|exec\(eval\(sys\.stdin"),
    ("pytest", r"-m pytest"),
    ("torchrun", r"torch\.distributed\.run|torchrun"),
)


def kind(cmd: str) -> str:
    m = re.search(r"(?:-m streamrec(?:\.app\.cli)?|bin/streamrec) (\w+)", cmd)
    if m:
        return f"streamrec {m.group(1)}"
    return next((k for k, pat in KINDS if re.search(pat, cmd)), "other" if cmd else "unknown")


def sample(root: psutil.Process, seen: dict, stop: threading.Event) -> None:
    """Every half second, the CPU seconds so far of ``root`` and each process below it, by (pid, start time)."""
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                with p.oneshot():
                    key, cmd, t = (p.pid, p.create_time()), " ".join(p.cmdline()), p.cpu_times()
            except psutil.Error:
                continue
            old = seen.get(key)
            seen[key] = (old[0] if old and old[0] else cmd, t.user + t.system)
        stop.wait(0.5)


def main(argv: list[str]) -> int:
    args = argv[argv.index("--") + 1:] if "--" in argv else ["-q", "-n", "4"]
    seen: dict = {}
    stop = threading.Event()
    t0 = time.time()
    run = subprocess.Popen([sys.executable, "-m", "pytest", *args])
    sampler = threading.Thread(target=sample, args=(psutil.Process(run.pid), seen, stop), daemon=True)
    sampler.start()
    code = run.wait()
    wall = time.time() - t0
    stop.set()
    sampler.join()
    by_kind: Counter = Counter()
    count: Counter = Counter()
    for cmd, cpu in seen.values():
        k = kind(cmd)
        by_kind[k] += cpu
        count[k] += 1
    total, cores = sum(by_kind.values()), os.cpu_count() or 1
    print(f"\nwall {wall:.0f} s; processes used at least {total:.0f} CPU-s of the {wall * cores:.0f} that {cores} "
          f"cores give in that time ({total / (wall * cores):.0%})")
    for k, cpu in by_kind.most_common():
        print(f"  {cpu:8.1f} CPU-s  {count[k]:4d} processes  {k}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
