"""Every ``streamrec bench NAME`` runs at its ``--tiny`` size and ends with one JSON object holding the
figures its goals name, each finite: a bench that breaks (a renamed attribute, a key dropped, a ratio
divided by zero) fails here, not on the next person who runs it. Nothing here asserts a speed.

Benches that need Kafka share the session's embedded broker (``--bootstrap``). ``bench train --tiny`` and its
``--host-ceiling`` and ``--device-busy`` modes are the GPU check's dry-run benches: their figures are read from
that one run (tests/project/conftest.py) rather than measured twice."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from streamrec.benchmarks.bench_join import PARTITIONS as JOIN_PARTITIONS
from streamrec.benchmarks.cli import NAMES
from tests.project.conftest import DRY_RUN_BENCHES, GPU_CHECK_WORKER

# name -> (extra arguments, keys the JSON must hold: the figures its goals and baselines name)
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "ingest": ([], ["arrow_events_per_s", "json_events_per_s", "raw_events_per_s", "arrow_vs_raw", "json_vs_raw",
                    "arrow_vs_json", "arrow_decode_events_per_s"]),
    "store": ([], ["device", "tiered_rows_per_s", "memory_rows_per_s", "rocks_rows_per_s", "tiered_vs_memory",
                   "tiered_vs_rocks", "hot_hit_rate", "tiered_rss_vs_memory", "tiered_table_mb_vs_memory",
                   "tiered_vs_rocks_traffic_bound", "tiered_vs_rocks_of_bound"]),
    "sketch": ([], ["sketch_ids_per_s", "counter_ids_per_s", "sketch_vs_counter", "sketch_vs_counter_per_event",
                    "topk_recall", "topk_recall_undecayed"]),
    "train": ([], ["device", "fae_events_per_s", "memory_events_per_s", "cold_events_per_s", "fae_vs_memory",
                   "fae_vs_cold", "auc_fae", "auc_memory", "auc_cold", "fae_rss_vs_memory"]),
    "serve": (["--processes", "2"], [
        "device", "p99_ms_b64", "qps_b512", "inproc_qps_b512", "grpc_vs_inproc_b512", "full_push_s", "delta_push_s",
        "freshness_s", "bound_qps_b512", "grpc_vs_bound_b512", "p99_ratio_under_abuse", "p99_ratio_under_heavy",
        "latency_floor_p99_ms_b64", "handler_bound_vs_bound_b512", "group_qps_b512", "group_vs_one_b512",
        "group_vs_bound_b512", "verify_ms", "verify_s_per_gb", "shadow_vs_single_b512", "split_vs_single_b512"]),
    "fuzz": ([], ["inputs", "other_exceptions", "crashes", "mutated_msgs_per_s", "valid_msgs_per_s",
                  "mutated_vs_valid", "slowest_ms"]),
    "scale": ([], ["auc_n1", "events_per_s_n1", "exact_dauc_n2", "online_dauc_n2", "cpu_inflation_n2",
                   "bytes_per_event_n2", "ref_cpu_per_event_us_n2", "cpu_contention_n2", "dauc_vs_fp32_n2_bf16",
                   "projection"]),
    "quality": ([], ["synthetic", "goals_met"]),
    "merge": ([], ["latency_p50_ratio", "latency_p99_ratio", "latency_p50_s_on", "latency_p50_s_off",
                   "wait_p50_ms_on", "inversions_on", "inversions_off"]),
    "e2e": (["--no-freshness"], [
        "sketch_events_per_s", "train_json_alone_events_per_s", "train_json_events_per_s",
        "train_arrow_events_per_s", "raw_consume_events_per_s", "sketch_vs_train_json", "sketch_vs_train_json_cpu",
        "train_json_vs_arrow", "freshness_p50_s", "freshness_p99_s", "goals"]),
    "freshness": ([], ["freshness_p50_s", "freshness_p99_s", "probes", "checkpoint_interval_s",
                       "freshness_p50_vs_checkpoint_interval", "freshness_p50_vs_configured_checkpoint_every_s"]),
    "join": ([], ["join_events_per_s", "join_2_workers_events_per_s", "join_scaling_2_workers",
                  "train_json_events_per_s", "raw_consume_events_per_s", "join_vs_train_json",
                  "join_vs_raw", "auc_oracle", "auc_oracle_delayed", "auc_window", "auc_fake_negative",
                  "auc_fake_negative_naive", "auc_gap_best", "auc_gap_label_delay", "auc_gap_fake_negative_vs_delayed",
                  "calibration_fake_negative", "calibration_fake_negative_naive",
                  "freshness_p50_s_window", "freshness_p99_s_window", "freshness_p50_s_fake_negative",
                  "freshness_p99_s_fake_negative", "state_bytes_per_impression", "restart_s",
                  "restart_state_impressions", "goals"]),
    "incidents": ([], ["clean_versions_held_share", "served_auc_drop_max", "served_auc_drop_max_unguarded",
                       "pushes_to_hold_max", "recovery_versions_max", "final_push_lag_events", "streams", "drills"]),
    "tables": ([], ["synthetic", "movielens", "recommended_admit_min_count", "int8_served_auc_diff",
                    "fp16_served_auc_diff", "int8_table_bytes_ratio", "fp16_table_bytes_ratio", "int8_push_bytes_ratio",
                    "fp16_push_bytes_ratio", "int8_max_score_diff", "dim32", "cap_rows", "auc_cost_cap_lfu",
                    "auc_cost_cap_lru", "rows_cap_lfu", "rows_cap_lru", "rows_no_cap", "evicted_lfu", "evicted_lru",
                    "goals"]),
    "cluster": ([], ["loopback", "links", "auc_cluster_minus_loopback", "offsets_committed", "kafka_bytes_per_event",
                     "predicted_vs_measured", "host_loss_detect_s", "host_loss_recover_s", "events_lost",
                     "events_duplicated", "goals"]),
}
BROKER = {"ingest", "merge", "e2e", "freshness", "join"}
# JSON paths whose null is part of the figure's meaning, not a failed measurement
NULL_OK = {
    "scale": ("projection[0].",),  # one rank puts nothing on the wire: no network-bound rate to project
    "e2e": ("freshness_p50_s", "freshness_p99_s", "goals["),  # --no-freshness: reported as FAIL with its reason
    # too few versions or checkpoints after the warm-up (a loaded machine) for a rate: null with a note saying so
    "freshness": ("versions_per_s", "checkpoint_interval_s", "freshness_p50_vs_checkpoint_interval"),
    # resumed_after_events: null where promotion did not resume within the run; offsets_match: null when the
    # served version's manifest is no longer on disk
    "incidents": ("drills[", "final_push.stops."),
    # --tiny: one unshaped link (nothing link-bound to predict) and no host lost, each goal a FAIL naming why
    "cluster": ("host_loss_", "events_lost", "events_duplicated", "goals["),
}


def _run(name: str, extra: list[str], timeout: float = 240.0) -> dict:
    cmd = [sys.executable, "-m", "streamrec", "bench", name, "--tiny", "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    print(p.stderr[-4000:])  # shown with a failed check: the bench's own account of a bad figure
    last = p.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    assert isinstance(out, dict), last
    return out


def _dry_run_name(name: str, extra: list[str]) -> str | None:
    """The GPU check's name of the bench run ``streamrec bench NAME EXTRA --tiny`` is, if its dry run makes it."""
    return next((k for k, args in DRY_RUN_BENCHES.items() if args == (name, *extra)), None)


def _result(name: str, extra: list[str], request) -> dict:
    """The JSON of ``streamrec bench NAME EXTRA --tiny --json``: from the GPU check's dry run where it runs that
    bench (the same command with ``--device cpu``), else from a run of its own."""
    key = _dry_run_name(name, extra)
    if key is None:
        return _run(name, extra)
    bench = request.getfixturevalue("gpu_check_dry_run").summary["benches"][key]
    assert bench["rc"] == 0 and "result" in bench, f"bench {name} {' '.join(extra)}: {bench.get('error')}"
    assert sorted(bench["command"].split()[1:]) == sorted(["bench", name, *extra, "--tiny", "--json", "--device", "cpu"])
    return bench["result"]


def _on_dry_run_worker(name: str, extra: list[str], *values):
    """A parameter of the bench tests, on the dry run's xdist worker when its figures come from the dry run."""
    return pytest.param(*values, marks=[GPU_CHECK_WORKER] if _dry_run_name(name, extra) else [])


def _bad_numbers(x, path: str = "") -> list[str]:
    """Paths of non-finite numbers and of nulls in a JSON value."""
    if isinstance(x, dict):
        return [b for k, v in x.items() for b in _bad_numbers(v, f"{path}.{k}" if path else k)]
    if isinstance(x, list):
        return [b for i, v in enumerate(x) for b in _bad_numbers(v, f"{path}[{i}]")]
    if x is None:
        return [f"{path} = null"]
    if isinstance(x, float) and not math.isfinite(x):
        return [f"{path} = {x}"]
    return []


def _check(name: str, out: dict) -> None:
    keys = BENCHES[name][1]
    missing = [k for k in keys if k not in out]
    assert not missing, f"bench {name}: JSON lacks {missing}; has {sorted(out)}"
    allowed = NULL_OK.get(name, ())
    bad = [b for b in _bad_numbers(out) if not (b.endswith("= null") and b.startswith(allowed))]
    assert not bad, f"bench {name}: {bad}"


def test_every_bench_is_in_the_smoke_table():
    assert set(NAMES) == set(BENCHES), "a bench without a smoke run here can rot unnoticed"


@pytest.mark.subprocess
@pytest.mark.parametrize("name", [_on_dry_run_worker(n, BENCHES[n][0], n) for n in sorted(set(BENCHES) - BROKER)])
def test_bench_runs_tiny_and_reports_its_goal_figures(name, request):
    if name == "cluster":
        from streamrec.benchmarks import netns

        if netns.available():
            pytest.skip(f"bench cluster needs network namespaces: {netns.available()}")
    out = _result(name, BENCHES[name][0], request)
    _check(name, out)
    if name == "cluster":  # two hosts train the loopback group's model, and every offset ends committed
        assert abs(out["auc_cluster_minus_loopback"]) <= 0.001 and out["offsets_committed"] is True
        assert out["links"]["0"]["events"] == out["loopback"]["events"] == 6_000
        assert out["links"]["0"]["collective_bytes_per_event"] > 0
        assert all(g["reason"] for g in out["goals"] if g["value"] is None)
    if name == "fuzz":
        assert out["other_exceptions"] == 0 and out["crashes"] == 0
    if name in ("train", "store", "serve"):
        assert out["device"] == "cpu"
    if name == "quality":
        assert set(out["synthetic"]) >= {"auc_trainer", "auc_reference", "auc_fae", "goals"}
    if name == "incidents":  # every drill, the clean one too, on both streams; the top-level share is the larger
        from streamrec.benchmarks.bench_incidents import CLEAN, DRILLS, STREAMS

        assert {(d["stream"], d["drill"]) for d in out["drills"]} == {(s, d) for s in STREAMS for d in (CLEAN, *DRILLS)}
        shares = [out["streams"][s]["clean_versions_held_share"] for s in STREAMS]
        assert out["clean_versions_held_share"] == max(shares) and all(0 <= x <= 1 for x in shares)
        assert all(d["versions_judged"] == d["versions"] - 1 > 0 for d in out["drills"])
        from streamrec.benchmarks.final_push_lag import STOPS  # a real trainer ended each way, its lag measured

        stops = out["final_push"]["stops"]
        assert set(stops) == set(STOPS) and all(s["exit_code"] == 0 and s["checkpoint_events"] > 0
                                                for s in stops.values()), stops
        assert out["final_push_lag_events"] == max(s["lag_events"] for s in stops.values()) >= 0


# a bench's other modes, each with the keys its goals name: (name, arguments, keys)
VARIANTS = [
    ("train", ["--model", "mlp"], ["events_per_s", "vs_dlrm", "auc"]),
    ("quality", ["--tasks", "click,conversion"], ["click_auc_multi", "click_auc_single", "click_auc_multi_minus_single",
                                                  "conversion_auc_multi", "conversion_auc_single", "goals"]),
    ("quality", ["--drift"], ["clean_drift_max", "drift_max_default", "streams", "goals"]),
    ("serve", ["--model", "deepfm"], ["exported_vs_module_b512", "models", "goals"]),
    ("train", ["--host-ceiling"], ["host_us_per_event", "device_ops_us_per_event", "host_events_per_s",
                                   "stages_us_per_event", "wall_us_per_event"]),
    ("train", ["--device-busy"], ["device_busy_share", "events_per_s", "top_host_ops"]),
]
VARIANT_NULL_OK = {"--device-busy": ("device_busy_share",)}  # a CPU has no device timeline: null with the reason


@pytest.mark.subprocess
@pytest.mark.parametrize("name,extra,keys", [_on_dry_run_worker(n, a, n, a, k) for n, a, k in VARIANTS],
                         ids=[f"{n}{'_'.join(a)}" for n, a, _ in VARIANTS])
def test_bench_modes_run_tiny_and_report_their_goal_figures(name, extra, keys, request):
    out = _result(name, extra, request)
    missing = [k for k in keys if k not in out]
    assert not missing, f"bench {name} {' '.join(extra)}: JSON lacks {missing}; has {sorted(out)}"
    allowed = tuple(p for a in extra for p in VARIANT_NULL_OK.get(a, ()))
    bad = [b for b in _bad_numbers(out) if not (b.endswith("= null") and b.startswith(allowed))]
    assert not bad, bad
    if extra == ["--model", "mlp"]:
        assert set(out["vs_dlrm"]) == {"dlrm", "mlp"} and out["vs_dlrm"]["dlrm"] == 1.0
    if name == "serve":  # the program as served scores exactly as the module
        assert out["models"]["deepfm"]["scores_equal_module"] is True
    if "--host-ceiling" in extra:  # the stages add up to the wall time, the host's share apart from the device's
        st = out["stages_us_per_event"]
        assert st["ids"] > 0 and st["device"] > 0 and out["device_ops_us_per_event"] == st["device"]
        assert out["host_us_per_event"] + out["device_ops_us_per_event"] == pytest.approx(out["wall_us_per_event"])
    if "--device-busy" in extra:
        assert out["device_busy_share"] is None and "CUDA" in out["reason"] and out["top_host_ops"]


@pytest.mark.subprocess
def test_e2e_arrow_backlog_trains_from_kafka_on_the_device(bootstrap):
    out = _run("e2e", ["--arrow-backlog", "--bootstrap", bootstrap, "--batch", "512",
                       "--set", "trainer.checkpoint_every_events=20000"])
    assert out["device"] == "cpu" and out["train_arrow_backlog_events_per_s"] > 0, out
    assert out["batch"] == 512 and out["checkpoint_every_events"] == 20_000, out
    assert not _bad_numbers(out), _bad_numbers(out)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(BROKER))
def test_broker_bench_runs_tiny_and_reports_its_goal_figures(name, bootstrap):
    out = _run(name, [*BENCHES[name][0], "--bootstrap", bootstrap])
    _check(name, out)
    if name == "freshness":  # an unmeasured figure says why
        for figure, note in (("versions_per_s", "versions_note"), ("checkpoint_interval_s", "baseline_note")):
            assert out[figure] is not None or "two are needed" in out[note], out
    if name == "e2e":  # a goal that was not measured stays in the output as a FAIL naming why
        goals = {g["key"]: g for g in out["goals"]}
        assert set(goals) == {"sketch_vs_train_json", "train_json_vs_arrow", "freshness_p50_s", "freshness_p99_s"}
        for k in ("freshness_p50_s", "freshness_p99_s"):
            assert goals[k]["status"] == "FAIL" and "--no-freshness" in goals[k]["reason"], goals[k]
        assert all(g["status"] in ("PASS", "FAIL") for g in goals.values())
        assert all(g["reason"] for g in goals.values() if g["value"] is None)
    if name == "freshness":  # the interval is null (with its note, above) when under two checkpoints were seen
        assert out["probes"] > 0 and (out["checkpoint_interval_s"] is None or out["checkpoint_interval_s"] > 0), out
    if name == "join":  # every example the join defines was read back; a fake negative waits for nothing
        assert out["join_examples"] > out["join_impressions"] > 0 and out["join_events_per_s"] > 0
        assert out["freshness_p50_s_fake_negative"] < out["freshness_p50_s_window"]
        assert {g["key"] for g in out["goals"]} == {"join_vs_train_json", "auc_gap_best", "calibration_fake_negative",
                                                    "restart_s", "auc_gap_fake_negative_vs_delayed",
                                                    "join_scaling_2_workers"}
        assert out["auc_gap_label_delay"] + out["auc_gap_fake_negative_vs_delayed"] == pytest.approx(
            out["auc_oracle"] - out["auc_fake_negative"])  # the two parts make the fake-negative mode's gap
        assert out["join_2_workers_events_per_s"] > 0 and out["join_scaling_2_workers"] > 0  # both runs read back all
        assert out["restart_s"] > 0 and out["restart_state_impressions"] > 0  # the restarted worker joined again
        assert out["restart_read_ahead_partitions"] == JOIN_PARTITIONS  # its kept state read while its group formed


def test_incidents_drills_deliver_what_they_name_and_served_figures_follow_the_promotions():
    """The label flip inverts every label; the misaligned join takes the join's field from the event
    ``MISALIGN_ROWS`` later and leaves the rest alone; the held versions, the lag and the recovery count read
    off which versions were promoted."""
    from streamrec.benchmarks.bench_incidents import MISALIGN_FIELD, MISALIGN_ROWS, _corrupt, _served_figures
    from streamrec.foundation import EventBatch, JaggedIds

    n = 3 * MISALIGN_ROWS
    rng = np.random.default_rng(0)
    ids = {f: JaggedIds(rng.integers(1, 10**6, n), np.arange(n + 1)) for f in ("user", MISALIGN_FIELD)}
    events = EventBatch(np.arange(n), (rng.random(n) < 0.55).astype(np.float32), rng.random((n, 1), np.float32), ids)
    rows, labels = np.arange(10, 20), events.labels.copy()
    flip = _corrupt(events, rows, "label_flip", rng)
    assert np.array_equal(flip.labels, 1 - labels[rows]) and np.array_equal(events.labels, labels)  # a copy
    join = _corrupt(events, rows, "misaligned_join", rng)
    assert np.array_equal(join.sparse[MISALIGN_FIELD].values, events.sparse[MISALIGN_FIELD].values[rows + MISALIGN_ROWS])
    assert np.array_equal(join.sparse["user"].values, events.sparse["user"].values[rows])
    assert np.array_equal(join.labels, events.labels[rows]) and np.array_equal(join.dense, events.dense[rows])

    # versions of 100 events; the stream is clean from event 300; versions 4 and 5 beat the served one (v1)
    aucs = [0.70, 0.71, 0.60, 0.65, 0.72, 0.73, 0.74]
    pushes = [(100 * i, 100 * (i + 1), {}, auc) for i, auc in enumerate(aucs)]
    f = _served_figures(pushes, [0, 1, 5, 6], end=300)
    assert (f["versions_held"], f["versions_judged"]) == (3, 6)
    assert f["served_lag_events_max"] == 300 and f["served_lag_events_mean"] == pytest.approx(600 / 7)
    assert (f["recovery_versions"], f["recovered"]) == (1, True)  # v4 installed, v5 served
    f = _served_figures(pushes, [0, 1], end=300)
    assert (f["recovery_versions"], f["recovered"]) == (3, False)  # v4..v6 installed, none served


def test_device_option_resolves_and_refuses_a_missing_device():
    """``--device`` goes through the foundation's resolve_device; a CUDA device on a machine without one is a
    usage error (exit 2 from argparse), not a run on the wrong device."""
    import argparse

    import torch

    from streamrec.benchmarks.common import add_device_arg, bench_device

    p = argparse.ArgumentParser()
    add_device_arg(p)
    assert p.parse_args([]).device == "cpu"
    assert bench_device("cpu", p) == torch.device("cpu")
    assert bench_device("auto", p).type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            bench_device("cuda:0", p)
        assert e.value.code == 2
