"""What a user can get wrong at start is one line naming the problem and a non-zero exit, never a traceback:
a port in use (serving's, the embedded broker's), an unwritable data directory, a broker that does not
answer. Also: `--log-format json` makes that line (and every log line) a JSON object, and data dirs'
parents are created."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess


def _run(*args, cwd=None, timeout=120):
    env = dict(os.environ)
    env.pop("STREAMREC_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "streamrec", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def _one_error_line(r) -> str:
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("streamrec")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture
def taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_serving_port_in_use_is_one_line(tmp_path, taken_port):
    r = _run("serve", "--port", str(taken_port), "--data-dir", str(tmp_path))
    line = _one_error_line(r)
    assert r.returncode == 1
    assert f"port {taken_port} on 127.0.0.1" in line and "already in use" in line and "serving.port" in line


def test_embedded_broker_port_in_use_is_one_line(taken_port):
    r = _run("broker", "--port", str(taken_port))
    line = _one_error_line(r)
    assert r.returncode == 1
    assert f"127.0.0.1:{taken_port}" in line and "--port" in line
    assert r.stdout == ""  # no address printed for a broker that never ran


def test_unwritable_data_dir_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "file").write_text("x")  # a file where a directory must go fails even for root
    r = _run("serve", "--port", "0", "--data-dir", str(locked / "file" / "sub"))
    line = _one_error_line(r)
    assert r.returncode == 1
    assert f"{locked / 'file' / 'sub' / 'serving'}" in line and "serving.data_dir" in line and "writable" in line


def test_wrong_bootstrap_is_one_line_in_json_too(tmp_path):
    from streamrec.ingest import free_port

    port = free_port()  # nobody listens there
    r = _run("sketch", "--bootstrap", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"),
             "--set", "kafka.connect_timeout_s=3", "--log-format", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    records = [json.loads(x) for x in r.stderr.splitlines() if x.strip()]  # every stderr line is JSON
    errors = [x for x in records if x.get("level") == "error"]
    assert len(errors) == 1 and errors[0]["exit_code"] == 1
    assert f"no Kafka broker answered at 127.0.0.1:{port} within 3s" in errors[0]["msg"]
    assert "--bootstrap" in errors[0]["msg"]
    assert (tmp_path / "d" / "sketch").is_dir()  # parents of the data dir are created before anything else


def test_unknown_log_level_is_refused():
    r = _run("config", "--log-level", "chatty")
    assert r.returncode == 2 and "--log-level 'chatty'" in r.stderr and "Traceback" not in r.stderr
