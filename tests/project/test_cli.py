"""The CLI turns bad input into one clear line and a non-zero exit, never a traceback."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess


def _run(*args):
    return subprocess.run([sys.executable, "-m", "streamrec", *args], capture_output=True, text=True, timeout=60)


def test_bad_snapshot_dir_is_one_clear_line(tmp_path):
    r = _run("serve", "--snapshot", str(tmp_path / "missing"), "--port", "0",
             "--set", f"serving.data_dir={tmp_path / 'serving'}")
    assert r.returncode == 1
    assert "SnapshotError" in r.stderr and "manifest.json does not exist" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_value_names_the_key():
    r = _run("config", "--set", "trainer.batch_size=lots")
    assert r.returncode == 2
    assert "trainer.batch_size: expected an integer, got 'lots'" in r.stderr
