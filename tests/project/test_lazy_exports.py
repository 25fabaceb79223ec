"""Package surfaces load lazily: what a process imports decides its resident memory.

The trainer pushes snapshots (``serving``) and follows hot sets (``sketch``) but must
not load numba (~100 MB resident, used by the server's id index and the sketch
kernels); a process that only needs ``streamrec.ingest.synthetic`` must not load Kafka clients.
Each check runs in a fresh interpreter so that modules the test process has already
imported cannot hide an import that loads too much.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return set(out.split())


def test_trainer_imports_do_not_load_numba():
    mods = _modules_after(
        "import streamrec.trainer.service, streamrec.trainer.core, streamrec.trainer.snapshots\n"
        "import streamrec.trainer.hotset\n"
        "from streamrec.serving import SnapshotPusher\n"
        "from streamrec.snapshot import write_snapshot\n"
        "from streamrec.sketch import HotSetFollower")
    assert "streamrec.trainer.service" in mods and "streamrec.serving.client" in mods and "streamrec.sketch.follower" in mods
    assert "numba" not in mods
    assert "streamrec.serving.server" not in mods and "streamrec.sketch.kernels" not in mods


def test_synthetic_ids_do_not_load_kafka_or_arrow():
    mods = _modules_after("from streamrec.ingest.synthetic import zipf_ranks")
    assert "streamrec.ingest.synthetic" in mods
    assert not {"kafka", "aiokafka", "pyarrow"} & mods


def test_lazy_names_resolve_and_unknown_names_fail_clearly():
    from streamrec import ingest, serving, sketch, snapshot

    assert ingest.EventBatch.__name__ == "EventBatch"
    assert snapshot.write_snapshot.__module__ == "streamrec.snapshot.format"
    assert sketch.HotSetFollower.__module__ == "streamrec.sketch.follower"
    assert ingest.synthetic.__name__ == "streamrec.ingest.synthetic"  # a submodule resolves as an attribute
    for pkg in (ingest, serving, sketch, snapshot):
        assert set(pkg.__all__) <= set(dir(pkg))
        for name in pkg.__all__:  # every advertised name exists
            assert getattr(pkg, name) is not None
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        ingest.no_such_thing
