"""The package layout: one import name, layers that import only downward, one rule
for the device tier's size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import lint_imports  # noqa: E402  (scripts/ is not a package)

pytestmark = pytest.mark.subprocess

PARTS = ("ingest", "trainer", "sketch", "serving", "embedding_store", "benchmarks")
SUBCOMMANDS = ("broker", "produce", "generate", "sketch", "train", "serve", "predict", "demo", "report", "config",
               "bench")


def test_import_contracts_are_kept(tmp_path):
    res = lint_imports.lint(lint_imports.stage(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout and "KEPT" in res.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    staged = lint_imports.stage(tmp_path)
    ids = staged / "streamrec" / "foundation" / "ids.py"
    ids.write_text(ids.read_text() + "\nfrom streamrec.trainer import TrainerCore  # upward: foundation -> trainer\n")
    res = lint_imports.lint(staged)
    assert res.returncode != 0
    assert "BROKEN" in res.stdout and "streamrec.foundation.ids -> streamrec.trainer" in res.stdout, res.stdout


def test_streamrec_is_the_only_top_level_name_installed():
    import streamrec.ingest
    import streamrec.trainer

    assert Path(streamrec.ingest.__file__).parent == ROOT / "ingest"
    assert Path(streamrec.trainer.__file__).parent == ROOT / "trainer"
    code = "import importlib.util, sys; print([n for n in sys.argv[1:] if importlib.util.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code, *PARTS], cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"  # none of the parts is importable under its bare folder name


def test_folders_named_like_the_parts_in_the_working_directory_change_nothing(tmp_path):
    """A user's own trainer/, ingest/, ... next to where they run streamrec (each raising on import)."""
    for name in PARTS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise RuntimeError('the user\\'s own {name} package')\n")
    exe = Path(sys.executable).with_name("streamrec")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args):
        return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    helped = run(str(exe), "--help")
    assert helped.returncode == 0, helped.stderr
    for sub in SUBCOMMANDS:
        assert f"    {sub} " in helped.stdout, sub
    train = run(str(exe), "train", "--help")
    assert train.returncode == 0 and "--max-events" in train.stdout, train.stderr
    bench = run(str(exe), "bench", "store", "--help")  # the benchmarks import as streamrec.benchmarks too
    assert bench.returncode == 0, bench.stderr
    for runner in ((sys.executable, "-m", "streamrec", "--help"), (sys.executable, "-c", "import streamrec.trainer")):
        assert run(*runner).returncode == 0
    where = run(sys.executable, "-c", "import streamrec.trainer as t; print(t.__file__)")
    assert Path(where.stdout.strip()).parent == ROOT / "trainer"


def test_a_command_module_that_fails_to_import_is_an_error_not_a_missing_subcommand(monkeypatch):
    from streamrec.app import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", [*cli.COMMAND_MODULES, "streamrec.app.commands.no_such_module"])
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()


def test_version_flag():
    import streamrec

    out = subprocess.run([sys.executable, "-m", "streamrec", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"streamrec {streamrec.__version__}"
    assert streamrec.__version__ != "0+unknown"


@pytest.mark.parametrize("budget_bytes", [64 * 1024, 1_000_000, 3 * 68 * 1000 + 67])
def test_the_sketch_fills_the_device_tier_the_byte_budget_pays_for(tmp_path, budget_bytes):
    """The sketch's hot set for hot.budget_bytes has the rows the store's device tier holds: >= 95%, never more."""
    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import EventBatch, JaggedIds, hot_budget, hot_budget_rows
    from streamrec.app.config import load_config
    from tests.helpers.sketch import sketch_state

    cfg = load_config(None, {"hot.budget_bytes": budget_bytes, "hot.budget_rows": 7, "store.path": str(tmp_path),
                             "sketch.top_k": 50_000, "model.fields": [{"name": "user"}, {"name": "item"}]}, env={})
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    try:
        capacity = store.hot_capacity_rows
    finally:
        store.close()
    assert capacity == hot_budget_rows(cfg.hot, cfg.model) == budget_bytes // (4 * (cfg.model.embedding_dim + 1))
    state = sketch_state(cfg)
    rng = np.random.default_rng(0)
    n = 200_000
    sparse = {f: JaggedIds(rng.zipf(1.2, n).astype(np.int64) % 40_000, np.arange(n + 1, dtype=np.int64))
              for f in ("user", "item")}
    batch = EventBatch(ts=np.full(n, 1_700_000_000_000, np.int64), labels=np.zeros(n, np.float32),
                       dense=np.zeros((n, cfg.model.dense_dim), np.float32), sparse=sparse)
    state.restore(0, None)
    state.sketches[0].update_batch(batch)
    hs = state.choose(version=1)
    rows = sum(len(ids) for ids in hs.tables.values())
    assert 0.95 * capacity <= rows <= capacity, (rows, capacity)
