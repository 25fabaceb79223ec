"""A trainer whose data directory fills up or turns read-only stops with one line naming what failed,
the path, the errno and what to do (no traceback at ERROR level anywhere in the run), and once space is
back it resumes from its last checkpoint losing nothing."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from streamrec.app.logs import StderrHandler
from streamrec.foundation import ResourceError, is_resource_error, resource_error_line, resource_step
from streamrec.ingest import EventProducer, EventSchema, SyntheticStream
from streamrec.snapshot import rows_batch, write_snapshot
from streamrec.trainer.checkpoint import list_checkpoints, verify_checkpoint, write_checkpoint
from tests.helpers.disks import fill, tmpfs


def test_resource_errors_become_one_line_naming_the_path_and_the_errno():
    e = OSError(28, "No space left on device", "/data/ckpt/x")
    assert resource_error_line(e).startswith("no space left on the device (ENOSPC) at /data/ckpt/x: free space")
    rocks = Exception("IO error: No space left on device: While appending to file: /data/store/shard-000/000012.log")
    assert "(ENOSPC) at /data/store/shard-000/000012.log" in resource_error_line(rocks)
    wrapped = RuntimeError("checkpoint failed")
    wrapped.__cause__ = OSError(30, "Read-only file system", "/data/ckpt")
    assert resource_error_line(wrapped).startswith("the file system is read-only (EROFS) at /data/ckpt")
    assert "(EMFILE)" in resource_error_line(OSError(24, "Too many open files"))
    assert "ulimit" in resource_error_line(OSError(24, "Too many open files"))
    assert "(EACCES)" in resource_error_line(PermissionError(13, "Permission denied", "/data"))
    assert resource_error_line(ValueError("bad value")) is None
    assert resource_error_line(OSError(2, "No such file or directory", "/x")) is None


def test_resource_step_names_what_failed_and_the_path_the_library_did_not():
    with pytest.raises(ResourceError) as info:
        with resource_step("writing snapshot v7", "/data/snapshots/v000000007/rows-00000.parquet"):
            raise OSError(28, "Error writing bytes to file")  # pyarrow's: an errno, no path
    e = info.value
    assert isinstance(e, OSError) and e.errno == 28 and is_resource_error(e)
    assert str(e).startswith("writing snapshot v7 failed: no space left on the device (ENOSPC) at "
                             "/data/snapshots/v000000007/rows-00000.parquet: ")
    assert resource_error_line(RuntimeError("outer").with_traceback(None)) is None
    outer = RuntimeError("wrapped")
    outer.__cause__ = e
    assert resource_error_line(outer) == e.line  # what failed survives wrapping
    assert pickle.loads(pickle.dumps(e)).line == e.line  # crosses process boundaries (groups, siblings)
    with pytest.raises(ValueError):  # anything else passes through untouched
        with resource_step("writing x"):
            raise ValueError("a bug")


def test_a_resource_error_logged_at_error_with_its_traceback_is_one_line_and_the_traceback_goes_to_debug():
    out = io.StringIO()
    handler = StderrHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("streamrec.test_resource_errors")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.setLevel(logging.INFO)
        try:
            raise OSError(28, "No space left on device", "/data/snapshots/v1/dense.safetensors")
        except OSError:
            log.exception("building a snapshot failed")
        try:
            raise ValueError("a bug")
        except ValueError:
            log.exception("something else failed")
        lines = out.getvalue().splitlines()
        assert lines[0] == ("ERROR building a snapshot failed: no space left on the device (ENOSPC) at "
                            "/data/snapshots/v1/dense.safetensors: free space there or point the data directory at a "
                            "bigger disk. Nothing is lost: restart once it is fixed and the process resumes from its "
                            "last complete checkpoint")
        assert lines[1] == "ERROR something else failed"  # a bug keeps its traceback
        assert lines[2] == "Traceback (most recent call last):"
        out.truncate(0), out.seek(0)
        log.setLevel(logging.DEBUG)
        try:
            raise OSError(30, "Read-only file system", "/data")
        except OSError:
            log.exception("x")
        lines = out.getvalue().splitlines()
        assert lines[0].startswith("ERROR x: the file system is read-only (EROFS) at /data")
        assert lines[1].startswith("DEBUG ") and lines[2] == "Traceback (most recent call last):"
    finally:
        log.removeHandler(handler)
        log.propagate = True


@pytest.fixture
def small_disk(tmp_path):
    # room for the store and the checkpoints a run keeps (dense state, and the evidence's id memory: two
    # 64 KB bitsets per field)
    with tmpfs(tmp_path / "disk", "5m") as mnt:
        yield mnt


@pytest.fixture
def snap_disk(tmp_path):
    # room for the snapshots a run keeps (rows, dense weights and the exported program of each full one)
    with tmpfs(tmp_path / "snapdisk", "3m") as mnt:
        yield mnt


def _snapshot_args(cfg, version=1):
    rows = [rows_batch("user", np.arange(5000, dtype=np.int64), np.random.default_rng(0).random((5000, 16),
                                                                                              dtype=np.float32))]
    import torch

    return dict(version=version, parent_version=None, kind="full", dense_state={"w": torch.ones(64, 64)}, rows=rows,
                kafka_offsets={}, metrics={}, config_hash="x", newest_event_ms=0, model_config=cfg.to_dict()["model"])


@pytest.mark.subprocess  # mount, umount
def test_a_snapshot_on_a_full_disk_is_one_resource_error_naming_it_and_leaves_no_half_written_directory(snap_disk, cfg):
    filler = fill(snap_disk, leave=100_000)  # room for the dense weights, not for the rows
    out = snap_disk / "v000000003"
    with pytest.raises(ResourceError) as info:
        write_snapshot(out, **_snapshot_args(cfg, 3))
    assert info.value.errno == 28
    assert str(info.value).startswith(f"writing snapshot v3 failed: no space left on the device (ENOSPC) at {out}/")
    assert not out.exists()  # the half-written snapshot keeps no space
    filler.unlink()
    assert (write_snapshot(out, **_snapshot_args(cfg, 3)) / "manifest.json").is_file()  # space is back: it is written

    subprocess.run(["mount", "-o", "remount,ro", str(snap_disk)], check=True)
    with pytest.raises(ResourceError) as info:
        write_snapshot(snap_disk / "v000000004", **_snapshot_args(cfg, 4))
    assert str(info.value).startswith(f"writing snapshot v4 failed: the file system is read-only (EROFS) at {snap_disk}")


@pytest.mark.subprocess  # mount, umount
def test_a_checkpoint_on_a_full_or_read_only_disk_is_a_resource_error_and_nothing_is_set_aside(snap_disk):
    import torch

    def store(d: Path):
        d.mkdir()
        (d / "rows").write_bytes(os.urandom(200_000))
        return {}

    root = snap_disk / "ckpt"
    first = write_checkpoint(root, 1, {"offsets": []}, {"w": torch.ones(4)}, store)
    filler = fill(snap_disk, leave=50_000)
    with pytest.raises(ResourceError) as info:
        write_checkpoint(root, 2, {"offsets": []}, {"w": torch.ones(4)}, store)
    assert str(info.value).startswith(f"writing checkpoint 2 failed: no space left on the device (ENOSPC) at {root}")
    assert [p for _, p in list_checkpoints(root)] == [first]
    assert not list(root.glob(".tmp-ckpt-*"))  # the half-written one keeps no space
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(snap_disk)], check=True)
    with pytest.raises(ResourceError) as info:
        write_checkpoint(root, 2, {"offsets": []}, {"w": torch.ones(4)}, store)
    assert "(EROFS)" in str(info.value) and str(info.value).startswith("writing checkpoint 2 failed: ")
    assert verify_checkpoint(first)  # the good one still verifies and is where a restart resumes


@pytest.mark.subprocess
def test_out_of_file_handles_while_verifying_a_checkpoint_is_not_taken_for_corruption(tmp_path):
    """EMFILE (a real one: the process's open-file limit) while verifying: a ResourceError, the checkpoint is
    not set aside."""
    import torch

    root = tmp_path / "ckpt"
    write_checkpoint(root, 1, {"offsets": []}, {"w": torch.ones(4)}, lambda d: d.mkdir() or {})
    code = textwrap.dedent(f"""
        import os, resource, sys
        from streamrec.trainer.checkpoint import list_checkpoints, verify_checkpoint
        from streamrec.foundation import ResourceError
        [(_, ckpt)] = list_checkpoints({str(root)!r})
        n = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        keep = []
        try:
            while True:
                keep.append(open("/dev/null"))  # every handle in use
        except OSError:
            pass
        try:
            verify_checkpoint(ckpt)  # what choose_checkpoint asks; it sets aside only for a CheckpointError
        except ResourceError as e:
            print(e)
            sys.exit(3)
        sys.exit(0)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr[-2000:]
    assert res.stdout.startswith("verifying checkpoint ckpt-000000001 failed: too many open files (EMFILE)")
    assert [p.name for _, p in list_checkpoints(root)] == ["ckpt-000000001"]  # not set aside as corrupt


def _train(cfg_path, bootstrap, fmt="text"):
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--idle-exit", "2", "--no-progress", "--log-format", fmt]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _error_lines(stderr: str, fmt: str) -> list[str]:
    """The lines of a run's stderr at ERROR level (the CLI's last line counts: it is the run's error)."""
    out = []
    for line in stderr.splitlines():
        if fmt == "json":
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("level") in ("error", "critical"):
                out.append(rec["msg"])
        elif " ERROR " in line or " CRITICAL " in line or line.startswith("streamrec train: "):
            out.append(line)
    return out


def _assert_one_line(run, fmt: str, *wanted: str) -> str:
    assert run.returncode == 1, run.stderr[-4000:]
    errors = _error_lines(run.stderr, fmt)
    assert len(errors) == 1, run.stderr[-6000:]
    assert "Traceback" not in run.stderr, run.stderr[-6000:]  # INFO level: no traceback at all
    for w in wanted:
        assert w in errors[0], run.stderr[-8000:]
    return errors[0]


def _committed(bootstrap, cfg) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.kafka.trainer_group, enable_auto_commit=False)
    try:
        parts = c.partitions_for_topic(cfg.kafka.events_topic) or set()
        return {p: c.committed(TopicPartition(cfg.kafka.events_topic, p)) for p in sorted(parts)}
    finally:
        c.close()


def _newest_checkpoint(root) -> tuple[int, dict[int, int]]:
    cks = list_checkpoints(root)
    if not cks:
        return 0, {}
    seq, p = cks[-1]
    return seq, {int(part): int(o) for _t, part, o in json.loads((p / "state.json").read_text())["offsets"]}


@pytest.mark.subprocess
@pytest.mark.timeout(1500)  # above its own waits: five trainer runs of up to 300 s each
def test_a_full_then_read_only_data_dir_stops_with_one_line_and_resumes_losing_nothing(topics, tmp_path, bootstrap,
                                                                                      small_disk, snap_disk):
    cfg = topics
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 256, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s, t.keep_checkpoints = 1024, 600.0, 2
    t.hot_source, t.log_every_s = "none", 600.0
    # snapshots are built (not pushed) every 0.3 s on a disk of their own
    t.snapshot_every, t.push_snapshots, cfg.serving.push_every_s = 1, False, 0.3
    t.snapshot_dir = str(snap_disk / "snapshots")
    # the disk is sized for the store and the dense state: events waiting in the partition merge would be
    # checkpointed too (up to a few hundred KB here) and fill it on the run that must succeed
    t.merge_wait_ms = 0.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 256
    cfg.store.path, t.checkpoint_dir = str(small_disk / "store"), str(small_disk / "ckpt")
    cfg.store.host_cache_rows, cfg.store.block_cache_mb = 0, 8
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    total = 20_000
    for b in SyntheticStream(cfg).batches(total):
        prod.send_batch(b)
    prod.close()

    # 1. the snapshot disk is full (the data disk is not): the snapshot's write is the one line, not a traceback
    snap_filler = fill(snap_disk, leave=20_000)
    run = _train(cfg_path, bootstrap)
    _assert_one_line(run, "text", "writing snapshot v", f"no space left on the device (ENOSPC) at {snap_disk}",
                     "free space there")
    seq1, offs1 = _newest_checkpoint(t.checkpoint_dir)
    committed = _committed(bootstrap, cfg)
    # offsets are committed only for durable progress: never past the newest checkpoint
    assert all((committed.get(p) or 0) <= offs1.get(p, 0) for p in committed), (committed, offs1)
    snap_filler.unlink()

    # 2. the data disk fills up mid-run (shared with something else that leaves the trainer ~400 KB)
    filler = fill(small_disk, leave=400_000)
    run = _train(cfg_path, bootstrap)
    _assert_one_line(run, "text", "failed: no space left on the device (ENOSPC) at " + str(small_disk))
    seq2, offs2 = _newest_checkpoint(t.checkpoint_dir)
    committed = _committed(bootstrap, cfg)
    assert all((committed.get(p) or 0) <= offs2.get(p, 0) for p in committed), (committed, offs2)

    # 3. the data disk turns read-only (JSON logs: the one line is a JSON record too)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    run = _train(cfg_path, bootstrap, fmt="json")
    _assert_one_line(run, "json", "the file system is read-only (EROFS) at " + str(small_disk))

    # 4. space is back: the trainer resumes from its last checkpoint and trains everything
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    filler.unlink()
    ok = _train(cfg_path, bootstrap)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert not _error_lines(ok.stderr, "text"), ok.stderr[-3000:]
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["events"] == total  # everything after the last complete checkpoint was read again
    seq4, offs4 = _newest_checkpoint(t.checkpoint_dir)
    assert seq4 > max(seq1, seq2)  # new checkpoints
    # offsets advance: the newest checkpoint holds every partition past where the failed runs left it
    assert sum(offs4.values()) > sum(max(offs1.get(p, 0), offs2.get(p, 0)) for p in offs4)
    assert all(offs4[p] >= max(offs1.get(p, 0), offs2.get(p, 0)) for p in offs4)
    assert _committed(bootstrap, cfg) == offs4  # and its offsets are committed
    snaps = sorted((snap_disk / "snapshots").glob("v*/manifest.json"))
    assert snaps, "no snapshot built after space came back"
