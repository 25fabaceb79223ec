"""Package surfaces load lazily: what a process imports decides its resident memory.

The trainer pushes snapshots (``serving``) and follows hot sets (``sketch``) but must
not load numba (~100 MB resident, used by the server's id index and the sketch
kernels); a process that only needs ``ingest.synthetic`` must not load Kafka clients.
Each check runs in a fresh interpreter so earlier imports in the test process do not
hide a regression.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return set(out.split())


def test_trainer_imports_do_not_load_numba():
    mods = _modules_after(
        "import trainer.service, trainer.core, trainer.snapshots, trainer.hotset\n"
        "from serving import SnapshotPusher, write_snapshot\n"
        "from sketch import HotSetFollower")
    assert "trainer.service" in mods and "serving.client" in mods and "sketch.follower" in mods
    assert "numba" not in mods
    assert "serving.server" not in mods and "sketch.kernels" not in mods


def test_synthetic_ids_do_not_load_kafka_or_arrow():
    mods = _modules_after("from ingest.synthetic import zipf_ranks")
    assert "ingest.synthetic" in mods
    assert not {"kafka", "aiokafka", "pyarrow"} & mods


def test_lazy_names_resolve_and_unknown_names_fail_clearly():
    import ingest
    import serving
    import sketch

    assert ingest.EventBatch.__name__ == "EventBatch"
    assert serving.write_snapshot.__module__ == "serving.snapshot"
    assert sketch.HotSetFollower.__module__ == "sketch.follower"
    assert ingest.synthetic.__name__ == "ingest.synthetic"  # a submodule resolves as an attribute
    for pkg in (ingest, serving, sketch):
        assert set(pkg.__all__) <= set(dir(pkg))
        for name in pkg.__all__:  # every advertised name exists
            assert getattr(pkg, name) is not None
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        ingest.no_such_thing
