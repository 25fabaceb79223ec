"""Shared fixtures (one real embedded broker per test session, small configs) and the marker rules.

Group joins are slow on the embedded broker, so tests share the broker and use
unique topic names per test (``topics`` fixture) instead of restarting it.

Markers: ``broker``, ``grpc`` and ``subprocess`` say what a test starts; ``e2e`` is
every test that starts any of them, so ``pytest -m "not e2e"`` is the fast loop.
``pytest_collection_modifyitems`` below adds ``broker`` to every test that uses the
broker fixtures and ``e2e`` wherever it belongs; a test that starts a gRPC server or
a subprocess says so itself (a ``pytestmark`` or a mark on the test). A test not marked
``subprocess`` (or ``broker``) that starts a child process fails, so the fast loop
(``pytest -m "not e2e and not subprocess" --hypothesis-profile=dev``) stays in one process.
"""

from __future__ import annotations

import gc
import os
import sys

# One torch (OpenMP) thread in the test process and in every process it starts (they inherit the
# environment), as `streamrec demo` and torchrun ranks already do on a small machine: the suite runs
# on 2 cores next to a broker, servers and subprocesses, and two threads per process there spin
# against each other instead of working, at several times one thread's wall time and CPU. Set before
# torch is first imported, which reads it once; export OMP_NUM_THREADS to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# pytest keeps each test module's assertion-rewritten code in __pycache__ beside it, as it does wherever
# PYTHONDONTWRITEBYTECODE is unset: with the variable set, every worker of every run would parse and rewrite
# every test module again, the larger part of a worker's collection. The flag is read at each module's import,
# so it holds for every test module collected after this one.
sys.dont_write_bytecode = False

import multiprocessing.util
import subprocess
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from streamrec.ingest import EmbeddedBroker, ensure_topics, pipeline_topics
from streamrec.app.config import Config, load_config


# The suite runs on four xdist workers (`-n 4`, README) with `--dist loadgroup` (pyproject addopts): tests marked
# `xdist_group(HEAVY_GROUP)` run on one worker, one after another. They are the demo runs (which share the
# session's `scraped_demo` run: on several workers it would run on each) and the group kill test (11 torchrun launches):
# side by side they starved each other's processes of the 2 cores, and the scraped demo ended before its second
# scrape (seen once in CI).
HEAVY_GROUP = "heavy-e2e"


# Property tests: the "ci" profile (the default, and what CI and the README's test command run) keeps hypothesis's
# full example counts; the "dev" profile runs a tenth of them, for the fast loop
# (`pytest -m "not e2e and not subprocess" --hypothesis-profile=dev -n 2`). STREAMREC_HYPOTHESIS=dev selects it too.
FULL_EXAMPLES = 100  # hypothesis's own default max_examples, the "ci" count
settings.register_profile("ci", max_examples=FULL_EXAMPLES)
settings.register_profile("dev", max_examples=FULL_EXAMPLES // 10)
settings.load_profile(os.environ.get("STREAMREC_HYPOTHESIS", "ci"))


def fuzz_examples(full: int) -> int:
    """Examples for a property test that runs ``full`` of them under the "ci" profile: scaled by the active
    profile's count (a tenth under "dev", at least 5); STREAMREC_FUZZ_EXAMPLES, if set, wins."""
    if os.environ.get("STREAMREC_FUZZ_EXAMPLES"):
        return int(os.environ["STREAMREC_FUZZ_EXAMPLES"])
    return max(5, full * settings.default.max_examples // FULL_EXAMPLES)


@pytest.fixture(scope="session")
def broker():
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="session")
def bootstrap(broker) -> str:
    return broker.bootstrap


def small_config(tmp_path, **overrides) -> Config:
    """A small model config rooted in ``tmp_path``; ``overrides`` are 'section.key' -> value."""
    base = {
        "model.fields": [{"name": "user"}, {"name": "item"}, {"name": "tags"}],
        "generator.fields": [
            {"name": "user", "cardinality": 5000, "zipf": 1.1},
            {"name": "item", "cardinality": 2000, "zipf": 1.2},
            {"name": "tags", "cardinality": 500, "zipf": 1.1, "multi": 2},
        ],
        "model.dense_dim": 3,
        "model.embedding_dim": 8,
        "model.bottom_mlp": [16, 8],
        "model.top_mlp": [16],
        "store.path": str(tmp_path / "store"),
        "store.shards": 2,
        "sketch.state_dir": str(tmp_path / "sketch"),
        "trainer.checkpoint_dir": str(tmp_path / "ckpt"),
        "serving.data_dir": str(tmp_path / "serving"),
        "serving.port": 0,
    }
    base.update(overrides)
    return load_config(None, base, env={})


@pytest.fixture
def cfg(tmp_path) -> Config:
    return small_config(tmp_path)


def with_fresh_topics(cfg: Config, bootstrap: str) -> Config:
    """``cfg`` on fresh, uniquely named pipeline topics (created) and consumer groups of the shared broker."""
    suffix = uuid.uuid4().hex[:8]
    cfg.kafka.events_topic = f"events-{suffix}"
    cfg.kafka.dlq_topic = f"events-{suffix}.dlq"
    cfg.kafka.hotset_topic = f"hot-set-{suffix}"
    cfg.kafka.trainer_group = f"trainer-{suffix}"
    cfg.kafka.sketch_group = f"sketch-{suffix}"
    cfg.kafka.bootstrap = bootstrap
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    return cfg


@pytest.fixture
def topics(bootstrap, cfg):
    """Fresh, uniquely named pipeline topics on the shared broker; returns the config using them (a module-scoped
    fixture gets the same with ``with_fresh_topics(small_config(root), bootstrap)``)."""
    return with_fresh_topics(cfg, bootstrap)


BROKER_FIXTURES = frozenset({"broker", "bootstrap", "topics"})
# fixtures that start a child process (the openssl CLI for a throwaway certificate, `mount` for a small disk)
CHILD_FIXTURES = frozenset({"pem", "small_disk"})
E2E_MARKERS = ("broker", "grpc", "subprocess")
E2E_DIR = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(config, items):
    """``broker`` for every test using a broker fixture (directly or through another fixture), ``subprocess``
    for every test using a fixture that starts a child (CHILD_FIXTURES); ``e2e`` for every test marked
    ``broker``, ``grpc`` or ``subprocess`` and for all of tests/e2e/."""
    for item in items:
        if BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
        if CHILD_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)
        if any(item.get_closest_marker(m) for m in E2E_MARKERS) or E2E_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


# A test that starts a child process says so (marker ``subprocess``; ``broker`` for the embedded broker, a child
# process started by the session's broker fixture), so that ``-m "not e2e and not subprocess"`` is a loop in one
# process: for every other test, starting a child (subprocess, multiprocessing, fork, posix_spawn, os.system) in
# its set-up, call or tear-down fails the test.
_CHILD_STARTERS = (
    (subprocess.Popen, "_execute_child"),
    (multiprocessing.util, "spawnv_passfds"),
    (os, "fork"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
)
_CHILDREN_STARTED = pytest.StashKey[list]()


def pytest_collection_finish(session):
    """Marks each grouped test that ``--dist loadgroup`` did not keep in its group, to fail at set-up (ungrouped,
    the heavy tests would run side by side and the GPU check's dry run once per worker). What collection made (the
    imported modules, test functions, fixtures) lives as long as the session: frozen out of the cyclic collector's
    full passes, which would otherwise walk it again each time the tests' own objects pile up."""
    if getattr(session.config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in session.items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[_UNGROUPED] = True
    gc.collect()
    gc.freeze()


_UNGROUPED = pytest.StashKey[bool]()


def pytest_runtest_setup(item):
    """A test of an xdist group that pytest-xdist did not keep in its group fails before it starts anything."""
    if item.stash.get(_UNGROUPED, False):
        pytest.fail("pytest-xdist did not keep this xdist_group test in its group: this pytest and pytest-xdist "
                    "do not work together (pytest-dev/pytest-xdist#1386); ./scripts/setup.sh installs the pytest "
                    "constraints.txt pins", pytrace=False)


def _may_start_children(item) -> bool:
    return any(item.get_closest_marker(m) for m in ("subprocess", "broker"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _may_start_children(item):
        return (yield)
    started = item.stash.setdefault(_CHILDREN_STARTED, [])
    originals = [(owner, name, getattr(owner, name)) for owner, name in _CHILD_STARTERS if hasattr(owner, name)]

    def refuse(what):
        def starter(*args, **kwargs):
            started.append(what)
            raise AssertionError(f"{item.nodeid} starts a child process ({what}) but is not marked subprocess")
        return starter

    for owner, name, _orig in originals:
        setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        return (yield)
    finally:
        for owner, name, orig in originals:
            setattr(owner, name, orig)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that started a child unmarked fails even where the code it ran caught the refusal."""
    rep = yield
    started = item.stash.get(_CHILDREN_STARTED, None)
    if started:
        if rep.outcome != "failed":
            rep.outcome = "failed"
            rep.longrepr = f"{item.nodeid} started a child process ({', '.join(started)}) but is not marked subprocess"
        started.clear()  # reported once, in the phase that started it
    return rep


@pytest.fixture(autouse=True)
def _root_log_handlers_restored():
    """A test that sets up the CLI's logging in this process (``setup_logging``) leaves handlers on the root logger
    whose streams pytest closes after the test; a later test's log records would then fail on them ("I/O
    operation on closed file", written to stderr). Each test ends with the root logger's handlers and level as
    it found them."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:  # setup_logging removes the handlers it finds: pytest's own come back
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
