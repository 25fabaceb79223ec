"""Serving whose data directory is full or read-only refuses a push it cannot store or install with
RESOURCE_EXHAUSTED and one line (what failed, the path, the errno, what to do; no traceback at ERROR
level), keeps serving the version it has, and installs the next push once space is back."""

from __future__ import annotations

import io
import logging
import subprocess

import numpy as np
import pytest

from streamrec.app.logs import StderrHandler
from streamrec.serving import SnapshotPusher
from tests.helpers.disks import fill, tmpfs
from tests.helpers.serving import events_to_batch, serving_version_1

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]  # mount, umount


@pytest.fixture
def disk(tmp_path):
    """A real 16 MB tmpfs (CI runs as root and must run this: there a mount failure fails the test)."""
    with tmpfs(tmp_path / "disk", "16m") as mnt:
        yield mnt


@pytest.fixture
def log_lines():
    """What serving's log handler (every process's: streamrec.app.logs) writes at INFO, as lines."""
    out = io.StringIO()
    handler = StderrHandler(out)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    log = logging.getLogger("streamrec")
    old = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    mark = [0]

    def since_last() -> list[str]:
        text = out.getvalue()
        lines, mark[0] = text[mark[0]:].splitlines(), len(text)
        return lines

    yield since_last
    log.removeHandler(handler)
    log.setLevel(old)


def _errors(lines: list[str]) -> list[str]:
    return [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln]


def _push(target, snap):
    with SnapshotPusher(target, token="push-tok", attempts=1) as p:
        return p.push(snap)


def _dirs(root):
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_a_full_then_read_only_data_dir_refuses_pushes_with_one_line_and_keeps_serving(cfg, tmp_path, disk,
                                                                                       log_lines):
    cfg.serving.data_dir = str(disk / "serving")
    gen = serving_version_1(cfg, tmp_path)
    srv, trainer, touched, client, events, want = next(gen)
    try:
        log_lines()
        changed = trainer.step()
        touched.add(changed)
        v2 = trainer.snapshot("delta", changed)
        want2 = trainer.scores(events_to_batch(cfg, events))

        # 1. full: the push is refused, twice (a pusher retries it), with one ERROR line, and v1 keeps serving
        filler = fill(disk, leave=0)
        for _ in range(2):
            r = _push(srv.target, v2)
            assert not r.ok and r.code == "RESOURCE_EXHAUSTED", (r.code, r.reason)
            assert "no space left on the device (ENOSPC) at " + str(disk) in r.reason, r.reason
            assert "version 1 keeps serving" in r.reason
        lines = log_lines()
        errors = _errors(lines)
        assert len(errors) == 1, lines
        assert "push refused: " in errors[0] and "failed: no space left on the device (ENOSPC) at " + str(disk) \
            in errors[0] and "free space there" in errors[0], errors[0]
        assert not any("Traceback" in ln for ln in lines), lines
        assert sum(" WARNING " in ln and "push refused" in ln for ln in lines) == 1  # the retry: not a new alert
        scores, version = client.predict(events)
        assert version == 1 and np.max(np.abs(scores - want)) <= 1e-6
        assert _dirs(srv.service.staging) == []  # nothing half-received keeps space
        assert _dirs(srv.service.versions) == ["v000000000001"]

        # 2. room for the received snapshot but not for installing it
        filler.unlink()
        filler = fill(disk, leave=2 * sum(f.stat().st_size for f in v2.iterdir()) + 64 * 1024)
        r = _push(srv.target, v2)
        assert not r.ok and r.code == "RESOURCE_EXHAUSTED", (r.code, r.reason)
        assert f"installing version 2 failed: no space left on the device (ENOSPC) at {srv.service.versions}" \
            in r.reason, r.reason
        lines = log_lines()
        errors = _errors(lines)  # another write failed: news for the operator, one line again
        assert len(errors) == 1 and "installing version 2 failed" in errors[0], lines
        assert not any("Traceback" in ln for ln in lines), lines
        assert client.predict(events)[1] == 1
        assert _dirs(srv.service.versions) == ["v000000000001"]  # the half-installed version is gone
        filler.unlink()

        # 3. read-only: refused with one (new) ERROR line, v1 keeps serving
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        r = _push(srv.target, v2)
        assert not r.ok and r.code == "RESOURCE_EXHAUSTED", (r.code, r.reason)
        assert "the file system is read-only (EROFS) at " + str(disk) in r.reason, r.reason
        lines = log_lines()
        errors = _errors(lines)
        assert len(errors) == 1 and "(EROFS)" in errors[0], lines
        assert not any("Traceback" in ln for ln in lines), lines
        assert client.predict(events)[1] == 1

        # 4. space is back: the next push is accepted and served
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        r = _push(srv.target, v2)
        assert r.ok, (r.code, r.reason)
        scores, version = client.predict(events)
        assert version == 2 and np.max(np.abs(scores - want2)) <= 1e-6
        assert not _errors(log_lines())
    finally:
        next(gen, None)
