"""A trainer whose data directory fills up or turns read-only stops with one line naming
the path and what to do, and once space is back it resumes losing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from streamrec.foundation import resource_error_line
from streamrec.ingest import EventProducer, SyntheticStream



def test_resource_errors_become_one_line_naming_the_path():
    e = OSError(28, "No space left on device", "/data/ckpt/x")
    assert resource_error_line(e).startswith("no space left on the device at /data/ckpt/x: free space")
    rocks = Exception("IO error: No space left on device: While appending to file: /data/store/shard-000/000012.log")
    assert "at /data/store/shard-000/000012.log" in resource_error_line(rocks)
    wrapped = RuntimeError("checkpoint failed")
    wrapped.__cause__ = OSError(30, "Read-only file system", "/data/ckpt")
    assert resource_error_line(wrapped).startswith("the file system is read-only at /data/ckpt")
    assert "ulimit" in resource_error_line(OSError(24, "Too many open files"))
    assert resource_error_line(ValueError("bad value")) is None


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    # CI runs as root and must run this test: there a tmpfs that cannot be mounted fails it; elsewhere it skips
    # with the reason printed (-rs)
    give_up = pytest.fail if os.environ.get("CI") else pytest.skip
    if os.geteuid() != 0:
        give_up("mounting a tmpfs needs root; this test environment runs as another user")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        give_up(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _train(cfg_path, bootstrap):
    cmd = [sys.executable, "-m", "streamrec", "train", "--config", str(cfg_path), "--bootstrap", bootstrap,
           "--idle-exit", "2", "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
@pytest.mark.timeout(960)  # above its own waits: three trainer runs of up to 300 s each
def test_a_full_then_read_only_data_dir_stops_cleanly_and_resumes_losing_nothing(topics, tmp_path, bootstrap,
                                                                                  small_disk):
    cfg = topics
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 256, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s, t.keep_checkpoints = 1024, 600.0, 2
    t.hot_source, t.snapshot_every, t.log_every_s = "none", 0, 600.0
    # the disk is sized for the store and the dense state: events waiting in the partition merge would be
    # checkpointed too (up to a few hundred KB here) and fill it on the run that must succeed
    t.merge_wait_ms = 0.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 256
    cfg.store.path, t.checkpoint_dir = str(small_disk / "store"), str(small_disk / "ckpt")
    cfg.store.host_cache_rows, cfg.store.block_cache_mb = 0, 8
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    prod = EventProducer(bootstrap, cfg)
    total = 20_000
    for b in SyntheticStream(cfg).batches(total):
        prod.send_batch(b)
    prod.close()

    # the disk is shared with something else that leaves the trainer ~400 KB: it fills up mid-run
    filler = small_disk / "filler"
    st = os.statvfs(small_disk)
    filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - 400_000))
    full = _train(cfg_path, bootstrap)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "no space left on the device at " + str(small_disk) in last, full.stderr[-3000:]
    assert "Traceback" not in full.stderr

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    ro = _train(cfg_path, bootstrap)
    assert ro.returncode == 1
    assert "read-only at " + str(small_disk) in ro.stderr.strip().splitlines()[-1], ro.stderr[-6000:]

    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    filler.unlink()  # space is back
    ok = _train(cfg_path, bootstrap)
    assert ok.returncode == 0, ok.stderr[-3000:]
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["events"] == total  # everything after the last complete checkpoint was read again
    assert Path(t.checkpoint_dir).is_dir()
