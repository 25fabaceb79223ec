"""``streamrec bench train --device-busy``: the share of a training step's wall time the device is busy.

``bench train``'s fae set-up (its DLRM, from an Arrow backlog, as ``--host-ceiling`` feeds it) trains
a few windows under ``torch.profiler``; the union of the CUDA kernels' and copies' intervals over the
profiled wall time is ``device_busy_share`` (goal >= 0.6 on a lent GPU: the host keeps the device fed).
The ten operators with the most device time and the ten with the most host time are listed. On a CPU
there is no device timeline: the share is ``null`` with the reason, and the host table still prints.
"""

from __future__ import annotations

import time

from .host_ceiling import pipeline

GOAL_BUSY = 0.6


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def run(events: int, ids: int, batch: int, threads: int, device: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .common import sync

    with pipeline(events, ids, batch, threads, device) as (core, decoder, backlog):
        cuda = torch.device(device).type == "cuda"
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        batches = [decoder.decode_many(v)[0] for v in backlog]  # decoded before: the steps are what is profiled
        sync(device)
        n0 = core.events
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for b in batches:
                core.feed(b)
            core.flush()
            sync(device)
            wall_us = (time.perf_counter() - t0) * 1e6
        n = core.events - n0
        kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = _union_us(kernels) / wall_us if cuda else None
        table = prof.key_averages()

        def top(*keys: str) -> list[dict]:  # the first attribute this torch has (older: self_cuda_time_total)
            key = next((k for k in keys if table and hasattr(table[0], k)), keys[0])
            rows = sorted(table, key=lambda e: getattr(e, key, 0.0), reverse=True)[:10]
            return [{"op": e.key, "us": round(getattr(e, key, 0.0), 1), "calls": e.count} for e in rows]

        out = {"device": device, "events": n, "batch": batch, "wall_s": wall_us / 1e6, "events_per_s": n / wall_us * 1e6,
               "device_busy_share": busy, "goal_device_busy_share": GOAL_BUSY,
               "top_device_ops": top("self_device_time_total", "self_cuda_time_total") if cuda else [],
               "top_host_ops": top("self_cpu_time_total")}
        if busy is None:
            out["reason"] = f"no device timeline on {device}: the share needs CUDA"
        return out


def report(r: dict) -> str:
    share = r["device_busy_share"]
    head = (f"device busy: {share:.0%} of the wall time (goal >= {r['goal_device_busy_share']:.0%}: "
            f"{'PASS' if share >= r['goal_device_busy_share'] else 'FAIL'})" if share is not None else
            f"device busy: not measured ({r['reason']})")
    ops = ", ".join(f"{o['op']} {o['us'] / 1e3:.1f} ms" for o in (r["top_device_ops"] or r["top_host_ops"])[:5])
    return f"{head}; {r['events_per_s']:,.0f} events/s on {r['device']}\n  top ops: {ops}"
