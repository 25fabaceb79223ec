"""Serving a snapshot's exported dense program: a user's model whose code the server never imports, every
task's score in ``Predict``, and programs that do not match their manifest refused while the old version
keeps serving. Real files, real RocksDB stores, real gRPC servers on 127.0.0.1 (one of them a separate
``streamrec serve`` process without the user's package on its path)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from streamrec.foundation import sha256_file
from streamrec.foundation.model_config import TaskSpec
from streamrec.serving import ServingClient, SnapshotPusher, serve
from streamrec.app.wiring import server_settings
from streamrec.serving import pb as _pb  # noqa: F401  (the generated messages load with the package)
from streamrec.snapshot import (MANIFEST, SnapshotError, empty_evidence, export_dense, read_manifest, rows_batch,
                                verify_snapshot, write_snapshot)
from streamrec.trainer import SnapshotPublisher
from tests.helpers.serving import events_to_batch, make_events

pytestmark = [pytest.mark.grpc, pytest.mark.subprocess]

USER_MODEL = '''
import torch
from torch import nn


class TwoTower(nn.Module):
    """dense and pooled through their own layer, then one head per task."""

    def __init__(self, dense_dim, pooled_dim, tasks, hidden=16):
        super().__init__()
        self.d = nn.Linear(dense_dim, hidden)
        self.p = nn.Linear(pooled_dim, hidden)
        self.heads = nn.Linear(2 * hidden, tasks)
        self.register_buffer("mix", torch.linspace(0.5, 1.5, 2 * hidden), persistent=False)

    def forward(self, dense, pooled):
        h = torch.cat([torch.relu(self.d(dense)), torch.tanh(self.p(pooled))], dim=1) * self.mix
        return self.heads(h)


def build(model_cfg):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_cfg.seed)
        return TwoTower(model_cfg.dense_dim, model_cfg.pooled_dim, len(model_cfg.tasks))
'''


VALUE_DEPENDENT_MODEL = '''
import torch
from torch import nn

from streamrec.foundation import ConfigError


class ClippedExperts(nn.Module):
    """A mixture of experts that clips the dense features only when a batch holds a large one: Python control
    flow on a value, which torch.export cannot capture."""

    def __init__(self, dense_dim, pooled_dim, tasks, experts):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(dense_dim + pooled_dim, tasks) for _ in range(experts))
        self.gate = nn.Linear(dense_dim, experts)

    def forward(self, dense, pooled):
        if float(dense.abs().max()) > 5:  # beyond any probe batch's values: only a real request takes it
            dense = dense.clamp(-5, 5)
        x = torch.cat([dense, pooled], dim=1)
        w = torch.softmax(self.gate(dense), dim=1)
        return (torch.stack([e(x) for e in self.experts], dim=2) * w.unsqueeze(1)).sum(dim=2)


def build(model_cfg):
    n = model_cfg.params["experts"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"model.params.experts: must be an integer >= 1, got {n!r}")
    return ClippedExperts(model_cfg.dense_dim, model_cfg.pooled_dim, len(model_cfg.tasks), n)


class Broken(nn.Module):
    def forward(self, dense, pooled):
        raise RuntimeError("the experts are not loaded")


def broken(model_cfg):
    return Broken()
'''


def _user_package(tmp_path, source: str) -> tuple[Path, str]:
    """A fresh package ``<name>.ranking`` holding ``source`` under ``tmp_path/userpkgs``, importable here
    until the test ends: (its root, its name)."""
    name = f"userrank_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "userpkgs"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "ranking.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(root))
    return root, name


def _forget_package(root: Path, name: str) -> None:
    sys.path.remove(str(root))
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


@pytest.fixture
def user_module(cfg, tmp_path):
    """A user's model in a package that only this (trainer-side) process can import: two tasks."""
    root, name = _user_package(tmp_path, USER_MODEL)
    cfg.model.module = f"{name}.ranking:build"
    cfg.model.tasks = [TaskSpec("click"), TaskSpec("conversion", 0.5)]
    try:
        yield name
    finally:
        _forget_package(root, name)


class Trainer:
    """The trainer's side of a snapshot: a real model and store, written by the trainer's SnapshotPublisher."""

    def __init__(self, cfg, tmp_path, seed: int = 0):
        from streamrec.embedding_store import EmbeddingStore
        from streamrec.foundation import hot_budget
        from streamrec.model import build_model

        self.cfg = cfg
        self.model = build_model(cfg.model).eval()
        self.store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), torch.device("cpu"), path=str(tmp_path / "trainer-store"))
        self.publisher = SnapshotPublisher(cfg.model, cfg.store, cfg.serving, tmp_path / "snapshots",
                                           model_hash=cfg.model_hash(), targets=cfg.push_targets(),
                                           push=False, keep=100)
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self.touched: dict[str, set] = {}

    def step(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.from_numpy(self.rng.standard_normal(tuple(p.shape)).astype(np.float32)) * 0.05)
        for t, dim in self.cfg.model.tables.items():
            ids = np.unique(self.rng.integers(0, 3000, 200).astype(np.int64))
            self.store.upsert_rows(t, ids, torch.from_numpy(self.rng.standard_normal((len(ids), dim)).astype(np.float32)))
            self.touched.setdefault(t, set()).update(ids.tolist())

    def snapshot(self, full: bool) -> Path:
        parent = self.version or None
        self.version += 1
        rows = [rows_batch(t, np.array(sorted(ids), np.int64), self.store.peek(t, np.array(sorted(ids), np.int64)))
                for t, ids in self.touched.items()]
        return self.publisher.publish(self.version, 0, self.store, self.model, {}, {"auc": 0.5},
                                      1_700_000_000_000 + self.version,
                                      plan=(full, None if full else parent, 0), rows=rows)

    def scores(self, batch) -> np.ndarray:
        from streamrec.model import predict_batch

        return predict_batch(self.model, batch, self.cfg.model, self.store.peek, torch.device("cpu"))


class ServeProcess:
    """``streamrec serve`` as its own process, its environment without the user's package (``pythonpath``: a
    folder it may import packages from)."""

    def __init__(self, data_dir: Path, pythonpath: Path | None = None):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(STREAMREC_SERVING__DATA_DIR=str(data_dir), STREAMREC_SERVING__PUSH_TOKEN="tok",
                   OMP_NUM_THREADS="1")
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-m", "streamrec", "serve", "--port", "0", "--device", "cpu"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.err: list[str] = []
        self._reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self._reader.start()
        self.target = self.proc.stdout.readline().strip()
        assert self.target, f"server did not start: {''.join(self.err)}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)


def test_a_users_model_is_served_by_a_process_that_cannot_import_it(cfg, tmp_path, user_module):
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    full = trainer.snapshot(full=True)
    m = read_manifest(full)
    assert m.tasks == ["click", "conversion"] and m.program is not None
    assert m.program["file"] in m.files and m.program["outputs"][0]["shape"] == ["batch", 2]
    assert m.program["inputs"][1]["shape"] == ["batch", cfg.model.pooled_dim]
    for name in m.files:  # safetensors and JSON only: nothing a server would unpickle
        assert name.endswith((".safetensors", ".json", ".parquet")), name
    json.loads((full / m.program["file"]).read_bytes())
    events = make_events(cfg, 40, seed=7)
    batch = events_to_batch(cfg, events)
    want1 = trainer.scores(batch)
    assert want1.shape == (40, 2)
    trainer.step()
    delta = trainer.snapshot(full=False)
    md = read_manifest(delta)
    assert md.kind == "delta" and md.program["sha256"] == m.program["sha256"] and m.program["file"] not in md.files
    want2 = trainer.scores(batch)

    srv = ServeProcess(tmp_path / "serving")
    try:
        # the server's environment really cannot import the user's package
        probe = subprocess.run([sys.executable, "-c", f"import {user_module}"], env=srv.env, capture_output=True)
        assert probe.returncode != 0 and b"ModuleNotFoundError" in probe.stderr
        with SnapshotPusher(srv.target, token="tok") as p:
            r = p.push(full)
            assert r.ok, r.reason
        with ServingClient(srv.target) as c:
            per_task, v = c.predict_tasks(events)
            first, _ = c.predict(events)
            st = c.status()
        assert v == 1 and list(per_task) == ["click", "conversion"]
        np.testing.assert_allclose(per_task["click"], want1[:, 0], atol=1e-6, rtol=0)
        np.testing.assert_allclose(per_task["conversion"], want1[:, 1], atol=1e-6, rtol=0)
        assert np.array_equal(first, per_task["click"])  # today's field: the first task
        assert st["tasks"] == ["click", "conversion"] and st["exported_program"] is True
        with SnapshotPusher(srv.target, token="tok") as p:
            r = p.push(delta)
            assert r.ok, r.reason
        with ServingClient(srv.target) as c:
            per_task, v = c.predict_tasks(events)
        assert v == 2
        np.testing.assert_allclose(np.stack([per_task["click"], per_task["conversion"]], 1), want2, atol=1e-6, rtol=0)
        assert np.abs(want2 - want1).max() > 1e-3  # the delta's weights are what changed the scores
    finally:
        srv.stop()
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)
    # a restart serves the stored version from its own copy of the program, still without the user's code
    srv = ServeProcess(tmp_path / "serving")
    try:
        with ServingClient(srv.target) as c:
            per_task, v = c.predict_tasks(events)
            assert c.status()["exported_program"] is True
        assert v == 2
        np.testing.assert_allclose(np.stack([per_task["click"], per_task["conversion"]], 1), want2, atol=1e-6, rtol=0)
    finally:
        srv.stop()


# -- refusals: an in-process server on 127.0.0.1, serving a good version 1 -------------------------------


class WideDense(nn.Module):
    """Reads one more dense column than the model config gives."""

    def __init__(self, dense_dim, pooled_dim, tasks):
        super().__init__()
        self.lin = nn.Linear(dense_dim + 1 + pooled_dim, tasks)

    def forward(self, dense, pooled):
        return self.lin(torch.cat([dense, pooled], dim=1))


class Guarded(nn.Module):
    """Asserts on its inputs at run time against a weight: with ``limit`` 0 every batch fails."""

    def __init__(self, dense_dim, pooled_dim, tasks):
        super().__init__()
        self.lin = nn.Linear(dense_dim + pooled_dim, tasks)
        self.register_buffer("limit", torch.tensor(1e9))

    def forward(self, dense, pooled):
        torch._assert_async(dense.abs().max() < self.limit, "dense feature above the limit")
        return self.lin(torch.cat([dense, pooled], dim=1))


def _rewrite(src: Path, dst: Path, edit_manifest=None, files: dict[str, bytes] | None = None) -> Path:
    """A copy of snapshot ``src`` with files replaced and the manifest edited, its checksums recomputed (so the
    refusal is the program's, not the transfer's)."""
    shutil.copytree(src, dst)
    for name, data in (files or {}).items():
        (dst / name).write_bytes(data)
    d = json.loads((dst / MANIFEST).read_bytes())
    d["version"] = 2
    if edit_manifest:
        edit_manifest(d)
    for name in d["files"]:
        d["files"][name] = {"sha256": sha256_file(dst / name), "bytes": (dst / name).stat().st_size}
    if d["program"] and d["program"]["file"] in d["files"]:
        d["program"]["sha256"] = d["files"][d["program"]["file"]]["sha256"]
    (dst / MANIFEST).write_text(json.dumps(d))
    read_manifest(dst)  # a well-formed manifest: the refusal comes from the program
    return dst


def _program_snapshot(cfg, out: Path, model: nn.Module, *, export_dims=None, tasks=None, weights=None) -> Path:
    """A full version-2 snapshot whose program is ``model``'s (exported at ``export_dims``: (dense, pooled)) and
    whose manifest describes the model config's inputs and ``tasks``."""
    mc = cfg.model
    tasks = tasks or list(mc.task_names)
    dd, pd = export_dims or (mc.dense_dim, mc.pooled_dim)
    ex = export_dense(model, dd, pd, len(model.lin.bias))
    entry = ex.manifest_entry(mc.dense_dim, mc.pooled_dim, tasks)
    entry["probe_logits"] = [[0.0] * len(tasks) for _ in entry["probe_logits"]]
    return write_snapshot(out, version=2, parent_version=None, kind="full",
                          dense_state=weights or model.state_dict(), rows=[], kafka_offsets={}, metrics={},
                          config_hash=cfg.model_hash(), newest_event_ms=1, model_config=cfg.to_dict()["model"],
                          tasks=tasks, program=entry, program_data=ex, evidence=empty_evidence())


@pytest.fixture
def serving_v1(cfg, tmp_path, user_module):
    cfg.serving.push_token = "tok"
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    v1 = trainer.snapshot(full=True)
    srv = serve(server_settings(cfg), device="cpu")
    events = make_events(cfg, 24, seed=3)
    with SnapshotPusher(srv.target, token="tok") as p:
        assert p.push(v1).ok
    with ServingClient(srv.target) as c:
        before, _ = c.predict_tasks(events)
    yield srv, v1, events, before
    srv.stop(0.5)


def _still_v1(srv, events, before) -> None:
    with ServingClient(srv.target) as c:
        got, v = c.predict_tasks(events)
    assert v == 1
    for t in before:
        assert np.array_equal(got[t], before[t])


def _refused(srv, snap: Path, *words: str) -> str:
    with SnapshotPusher(srv.target, token="tok", attempts=1) as p:
        r = p.push(snap)
    assert not r.ok and r.code == "INVALID_ARGUMENT", (r.code, r.reason)
    for w in words:
        assert w in r.reason, r.reason
    return r.reason


def test_a_program_reading_another_input_width_is_refused(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1
    mc = cfg.model
    bad = _program_snapshot(cfg, tmp_path / "wide", WideDense(mc.dense_dim, mc.pooled_dim, 2),
                            export_dims=(mc.dense_dim + 1, mc.pooled_dim))
    _refused(srv, bad, "raises on the probe batch")
    _still_v1(srv, events, before)


def test_a_program_with_another_task_count_is_refused(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1
    mc = cfg.model

    class OneTask(WideDense):
        def __init__(self):
            nn.Module.__init__(self)
            self.lin = nn.Linear(mc.dense_dim + mc.pooled_dim, 1)

    bad = _program_snapshot(cfg, tmp_path / "onetask", OneTask())
    _refused(srv, bad, "returns [8, 1]", "expected [8, 2]")
    # the manifest itself claiming one output for two tasks is refused before any file is stored
    d = tmp_path / "claims-one"

    def one_output(m):
        m["program"]["outputs"][0]["shape"] = ["batch", 1]
        m["program"]["probe_logits"] = [[0.0] for _ in m["program"]["probe_logits"]]

    with pytest.raises(SnapshotError, match="1 logits per event, the manifest names 2 tasks"):
        _rewrite(v1, d, one_output)
    _still_v1(srv, events, before)


def test_a_program_json_that_does_not_deserialize_is_refused(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1
    name = read_manifest(v1).program["file"]
    for i, blob in enumerate([b'{"graph_module": {"graph": 7}}', b"[1, 2", json.dumps({"schema_version": 1}).encode()]):
        bad = _rewrite(v1, tmp_path / f"garbage-{i}", files={name: blob})
        _refused(srv, bad, "program.json")
    _still_v1(srv, events, before)


def test_a_program_that_raises_at_run_time_is_refused(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1
    mc = cfg.model
    model = Guarded(mc.dense_dim, mc.pooled_dim, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    weights["limit"] = torch.tensor(0.0)  # the pushed weights make the program's own check fail
    bad = _program_snapshot(cfg, tmp_path / "raises", model, weights=weights)
    _refused(srv, bad, "raises on the probe batch", "dense feature above the limit")
    _still_v1(srv, events, before)


def test_a_program_whose_scores_differ_from_the_trainers_is_refused(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1

    def other_logits(m):
        m["program"]["probe_logits"][0][0] += 0.5

    bad = _rewrite(v1, tmp_path / "other-logits", other_logits)
    _refused(srv, bad, "differ from the trainer's")
    _still_v1(srv, events, before)


def test_a_program_file_changed_after_the_manifest_fails_its_checksum(cfg, tmp_path, serving_v1):
    srv, v1, events, before = serving_v1
    bad = tmp_path / "tampered"
    shutil.copytree(v1, bad)
    d = json.loads((bad / MANIFEST).read_bytes())
    d["version"] = 2
    (bad / MANIFEST).write_text(json.dumps(d))
    name = d["program"]["file"]
    blob = bytearray((bad / name).read_bytes())
    blob[len(blob) // 2] ^= 0x01
    (bad / name).write_bytes(bytes(blob))
    with pytest.raises(SnapshotError, match=f"{name}: sha256 does not match"):
        verify_snapshot(bad)
    with SnapshotPusher(srv.target, token="tok", attempts=1) as p:
        r = p.push(bad)
    assert not r.ok and "sha256" in r.reason and name in r.reason, r.reason
    _still_v1(srv, events, before)


def test_a_model_that_cannot_be_exported_is_snapshotted_without_a_program(cfg, tmp_path, caplog):
    """``program: null`` and one error line; serving then builds the module (it can import the built-ins)."""
    from streamrec.model import build_model

    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = build_model(cfg.model)

        def forward(self, dense, pooled):
            out = self.inner(dense, pooled)
            if float(out.sum()) > 1e30:  # Python control flow on a tensor's value: torch.export refuses it
                return out * 2
            return out

    trainer = Trainer(cfg, tmp_path)
    trainer.model = DataDependent().eval()
    trainer.step()
    with caplog.at_level("ERROR"):
        snap = trainer.snapshot(full=True)
    assert read_manifest(snap).program is None
    errors = [r for r in caplog.records if "no exported program" in r.getMessage()]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
    assert trainer.publisher.program_error


def test_a_failing_export_logs_one_line_and_one_debug_record_of_torchs_output(cfg, tmp_path, caplog, capfd):
    """torch.export's own warnings, symbolic-shape logs and FX graph dump stay out of the log: streamrec's one
    error line, and torch's output in one DEBUG record."""
    root, name = _user_package(tmp_path, VALUE_DEPENDENT_MODEL)
    try:
        cfg.model.module, cfg.model.params = f"{name}.ranking:build", {"experts": 2}
        trainer = Trainer(cfg, tmp_path)
        trainer.step()
        capfd.readouterr()
        with caplog.at_level("DEBUG"):
            snap = trainer.snapshot(full=True)
    finally:
        _forget_package(root, name)
    assert read_manifest(snap).program is None
    err = capfd.readouterr().err
    assert "def forward" not in err and "symbolic_shapes" not in err and "zuf0" not in err, err
    mine = [r for r in caplog.records if r.levelno >= logging.INFO or "torch" in r.getMessage()]
    assert [(r.name, r.levelname) for r in mine] == [("streamrec.snapshot.program", "DEBUG"),
                                                     ("streamrec.trainer.snapshots", "ERROR")], mine
    line, dump = mine[1].getMessage(), mine[0].getMessage()
    assert "\n" not in line and "cannot be exported with torch.export" in line
    assert "def forward" in dump and "Unable to find user code" in dump  # what torch said, kept for debugging


def test_a_value_dependent_module_is_built_and_served_by_a_server_that_imports_it(cfg, tmp_path):
    """A module torch.export refuses (a branch on a value) ships without a program; a server process that can
    import it builds it, probes it on the CPU with real tensors and serves the trainer's scores on both
    branches; a refusal names its real cause (a bad ``[model.params]`` value, a failing forward, a module
    that does not import there)."""
    root, name = _user_package(tmp_path, VALUE_DEPENDENT_MODEL)
    try:
        cfg.model.module, cfg.model.params = f"{name}.ranking:build", {"experts": 3}
        cfg.model.tasks = [TaskSpec("click"), TaskSpec("conversion", 0.5)]
        trainer = Trainer(cfg, tmp_path)
        trainer.step()
        full = trainer.snapshot(full=True)
        m = read_manifest(full)
        assert m.program is None and m.model_config["params"] == {"experts": 3}
        calm = make_events(cfg, 24, seed=5)
        for e in calm:
            e["dense"] = [x * 0.2 for x in e["dense"]]
        wild = [dict(e) for e in calm]
        wild[3] = dict(wild[3], dense=[9.0] + wild[3]["dense"][1:])  # one large value clips the whole batch
        want = {k: trainer.scores(events_to_batch(cfg, ev)) for k, ev in (("calm", calm), ("wild", wild))}
        assert np.abs(want["calm"] - want["wild"]).max() > 1e-4  # the two branches score differently
    finally:
        _forget_package(root, name)

    srv = ServeProcess(tmp_path / "serving", pythonpath=root)
    try:
        with SnapshotPusher(srv.target, token="tok") as p:
            r = p.push(full)
            assert r.ok, r.reason
        with ServingClient(srv.target) as c:
            for k, ev in (("calm", calm), ("wild", wild), ("calm", calm)):
                per_task, v = c.predict_tasks(ev)
                got = np.stack([per_task["click"], per_task["conversion"]], 1)
                assert v == 1
                np.testing.assert_allclose(got, want[k], atol=1e-6, rtol=0, err_msg=k)
            assert c.status()["exported_program"] is False

        def refusal(edit) -> str:
            snap = _rewrite(full, tmp_path / f"refused-{uuid.uuid4().hex[:6]}",
                            lambda d: edit(d["model_config"]))
            with SnapshotPusher(srv.target, token="tok", attempts=1) as p:
                r = p.push(snap)
            assert not r.ok and r.code == "INVALID_ARGUMENT", (r.code, r.reason)
            return r.reason

        reason = refusal(lambda mc: mc["params"].update(experts=0))
        assert "model.params.experts: must be an integer >= 1, got 0" in reason and "importable" not in reason
        reason = refusal(lambda mc: mc.update(module=f"{name}.ranking:broken"))
        assert "fails on a probe batch" in reason and "on cpu" in reason and "the experts are not loaded" in reason
        assert "importable" not in reason
        reason = refusal(lambda mc: mc.update(module=f"{name}_elsewhere.ranking:build"))
        assert f"cannot import '{name}_elsewhere.ranking'" in reason and "must be importable where serving runs" \
            in reason
        with ServingClient(srv.target) as c:
            per_task, v = c.predict_tasks(wild)
        assert v == 1  # every refusal kept the version it served
        np.testing.assert_allclose(np.stack([per_task["click"], per_task["conversion"]], 1), want["wild"],
                                   atol=1e-6, rtol=0)
    finally:
        srv.stop()
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)


def _old_predict_response():
    """``PredictResponse`` as a client built from the ``.proto`` before per-task scores knows it (fields 1-3)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="old_streamrec_test.proto", package="oldclient", syntax="proto3")
    m = f.message_type.add(name="PredictResponse")
    lab, T = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto
    m.field.add(name="scores", number=1, label=lab.LABEL_REPEATED, type=T.TYPE_FLOAT)
    m.field.add(name="model_version", number=2, label=lab.LABEL_OPTIONAL, type=T.TYPE_UINT64)
    m.field.add(name="request_ids", number=3, label=lab.LABEL_REPEATED, type=T.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oldclient.PredictResponse"))


def test_a_client_built_before_per_task_scores_reads_the_first_task(cfg, serving_v1):
    import grpc

    from streamrec.serving import events_to_request
    from streamrec.serving.pb import pb

    srv, v1, events, before = serving_v1
    old_cls = _old_predict_response()
    with grpc.insecure_channel(srv.target) as ch:
        call = ch.unary_unary("/streamrec.v1.StreamRec/Predict", request_serializer=pb.PredictRequest.SerializeToString,
                              response_deserializer=old_cls.FromString)
        for columns in (True, False):
            old = call(events_to_request(events, columns=columns), timeout=30)
            assert old.model_version == 1
            assert np.array_equal(np.asarray(old.scores, np.float32), before["click"])
            assert list(old.request_ids) == [e.get("request_id", "") for e in events]


@pytest.mark.parametrize("arch", ["dlrm", "deepfm"])
def test_a_built_in_model_scores_through_its_frozen_program(cfg, tmp_path, arch):
    """The program path keeps the module path's speed: its forward is frozen TorchScript of the program (the
    batch-sized reshape of ``pooled`` that DLRM and DeepFM make does not pin the trace to one batch size)."""
    cfg.model.architecture = arch
    cfg.serving.push_token = "tok"
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    snap = trainer.snapshot(full=True)
    assert read_manifest(snap).program is not None
    events = make_events(cfg, 33, seed=9)
    want = trainer.scores(events_to_batch(cfg, events))
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target, token="tok") as p:
            assert p.push(snap).ok
        v = srv.service.current
        assert v.program is not None and isinstance(v.forward, torch.jit.ScriptModule)
        with ServingClient(srv.target) as c:
            got, _ = c.predict_tasks(events)
        np.testing.assert_allclose(got["click"], want[:, 0], atol=1e-6, rtol=0)
    finally:
        srv.stop(0.5)


@pytest.mark.parametrize("arch", ["mlp", "dlrm"])
def test_shared_tables_and_per_field_widths_are_stored_once_and_served(tmp_path, arch):
    """``user`` and ``last_user`` share one table (stored and served once), ``tags`` has its own width: the
    snapshot has a row file per width, serving holds each table once and scores as the trainer does, with
    rows split between memory and the store."""
    from tests.conftest import small_config

    cfg = small_config(tmp_path, **{
        "model.architecture": arch,
        "model.fields": [{"name": "user"}, {"name": "last_user", "table": "user"}, {"name": "item"},
                         {"name": "tags", "dim": 4}],
        "generator.fields": [{"name": "user", "cardinality": 500}, {"name": "last_user", "cardinality": 500},
                             {"name": "item", "cardinality": 500}, {"name": "tags", "cardinality": 100, "multi": 2}],
        "serving.push_token": "tok", "serving.hot_rows": 300})
    assert cfg.model.tables == {"user": 8, "item": 8, "tags": 4}
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    snap = trainer.snapshot(full=True)
    m = read_manifest(snap)
    assert m.program is not None and len(m.row_files) == 2  # widths 8 and 4
    events = make_events(cfg, 30, seed=11, id_range=3000)
    for e in events[::3]:
        e["sparse"]["last_user"] = list(e["sparse"]["user"])  # the same ids through both fields
    want = trainer.scores(events_to_batch(cfg, events))
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target, token="tok") as p:
            r = p.push(snap)
            assert r.ok, r.reason
        v = srv.service.current
        assert v.memory.tables == ["user", "item", "tags"] and v.memory.pooled_dim == 8 + 8 + 8 + 4
        assert 0 < v.memory.rows <= 300 and v.rows_held == m.rows
        with ServingClient(srv.target) as c:
            got, _ = c.predict_tasks(events)
        np.testing.assert_allclose(got["click"], want[:, 0], atol=1e-6, rtol=0)
    finally:
        srv.stop(0.5)


def test_a_programs_weights_count_against_max_model_params(cfg, tmp_path, user_module):
    """With a program the module is never built to count its parameters: ``dense.safetensors`` is counted."""
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    snap = trainer.snapshot(full=True)
    n = sum(p.numel() for p in trainer.model.parameters())
    cfg.serving.push_token = "tok"
    cfg.serving.max_model_params = n - 1
    srv = serve(server_settings(cfg), device="cpu")
    try:
        reason = _refused(srv, snap, "serving.max_model_params", f"{n} dense parameters")
        assert "dense.safetensors" in reason
        with ServingClient(srv.target) as c:
            assert c.status()["serving"] is False
    finally:
        srv.stop(0.5)


def test_a_program_calling_anything_but_tensor_operators_is_refused(cfg, tmp_path, serving_v1):
    """The deserializer resolves a node's target to any attribute of ``torch``: ``torch.load`` would unpickle."""
    srv, v1, events, before = serving_v1
    name = read_manifest(v1).program["file"]
    prog = json.loads((v1 / name).read_bytes())
    nodes = prog["graph_module"]["graph"]["nodes"]
    for i, target in enumerate(["torch.load", "torch.ops.aten.from_file.default", "builtins.exec",
                                "torch.ops.higher_order.cond"]):
        bad_prog = json.loads(json.dumps(prog))
        bad_prog["graph_module"]["graph"]["nodes"][len(nodes) // 2]["target"] = target
        bad = _rewrite(v1, tmp_path / f"op-{i}", files={name: json.dumps(bad_prog).encode()})
        _refused(srv, bad, f"calls '{target}'", "only aten and prims")
    _still_v1(srv, events, before)


def test_a_program_whose_shape_expression_is_python_is_refused_unrun(cfg, tmp_path, serving_v1):
    """The deserializer hands shape expressions to ``sympy.sympify``, which evaluates Python."""
    srv, v1, events, before = serving_v1
    name = read_manifest(v1).program["file"]
    text = (v1 / name).read_text()
    marker = tmp_path / "ran"
    assert '"expr_str": "Symbol(' in text
    evil = f"__import__('pathlib').Path('{marker}').touch()"
    for i, expr in enumerate([evil, "Integer(10)**Integer(999999999)", "Symbol('s0').func"]):
        bad = _rewrite(v1, tmp_path / f"expr-{i}",
                       files={name: text.replace('"expr_str": "Symbol(', '"expr_str": ' + json.dumps(expr)[:-1] + ' Symbol(', 1).encode()})
        _refused(srv, bad, "symbolic expression")
    assert not marker.exists()
    _still_v1(srv, events, before)


def test_every_scoring_path_keeps_each_tasks_scores_with_its_event(cfg, tmp_path, user_module):
    """Heavy requests (scored in slices) and requests merged into one pass return each event's own scores for
    every task, the same as a request scored alone."""
    from concurrent.futures import ThreadPoolExecutor

    cfg.serving.push_token = "tok"
    cfg.serving.heavy_request_cost = 150  # the bigger requests below are heavy, the small ones are merged
    trainer = Trainer(cfg, tmp_path)
    trainer.step()
    snap = trainer.snapshot(full=True)
    sets = [make_events(cfg, n, seed=20 + i) for i, n in enumerate([3, 5, 7, 60, 2, 9, 80, 4])]
    want = [trainer.scores(events_to_batch(cfg, ev)) for ev in sets]
    srv = serve(server_settings(cfg), device="cpu")
    try:
        with SnapshotPusher(srv.target, token="tok") as p:
            assert p.push(snap).ok
        with ServingClient(srv.target) as c:
            def score(i):
                got, _ = c.predict_tasks(sets[i])
                return np.stack([got["click"], got["conversion"]], 1)

            for _ in range(3):
                with ThreadPoolExecutor(8) as pool:
                    results = list(pool.map(score, range(len(sets))))
                for got, w in zip(results, want):
                    np.testing.assert_allclose(got, w, atol=1e-6, rtol=0)
        assert srv.service.heavy_slices > 0
    finally:
        srv.stop(0.5)
