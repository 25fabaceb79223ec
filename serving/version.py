"""One loaded model version, how a snapshot becomes one, and how one comes back after a restart.

Staging choice (why deltas never disturb the version being served): every
version owns its own directory ``versions/v<N>/`` with its own embedding store
(``store/``, every row it holds) and in-memory rows (``MemoryRows``, up to
``serving.hot_rows`` of them). A full snapshot loads into a fresh store; a delta
first takes a RocksDB checkpoint of its parent's store (hard links to the
immutable SST files, so it costs little disk and time), opens that copy, and
upserts the changed rows there, and builds new memory rows from its parent's.
The parent is only read during this, so requests keep being answered from it.
The swap is one reference assignment; each request holds a reference (refcount)
to the version it started on, and a retired version's store is closed and its
directory removed only when its last request has finished.

Immutable once installed (why serving never answers from a damaged copy): a
version's store is written only while the version loads; then it is closed, and
every file of the version directory (dense weights, manifest, memory-row ids and
each RocksDB file of ``store/``) is recorded with its size and sha256 in
``served.json``, written last (atomically), so a directory with ``served.json``
is complete. From then on the store is opened read-only. A delta copies its
parent's store (hard links to the SST files, copies of the small mutable ones)
and writes only that copy. The record is checked, one hash per file, at every
start (``restore_version``) and before a delta is applied on a version
(``ServedVersion.verify``); never per request. RocksDB's ``LOCK`` and info
``LOG`` files hold no rows and are not recorded; any other file that is missing,
of another size or content, or not recorded at all, makes the version damaged
(``StoredVersionDamaged``, DATA_LOSS, naming the file). ``restore_newest`` serves
the newest complete version that verifies after a restart and skips (with a log
line) any that is half-written, damaged or fails its checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrec.foundation import ConfigError, as_resource_error, resource_error_line, save_npz, sha256_file
from streamrec.foundation.model_config import ModelConfig, model_config_from_dict as build_model_config
from streamrec.embedding_store.store_config import StoreConfig
from streamrec.serving.serving_config import ServingConfig
from streamrec.model import RankingModel, build_model, predict_batch
from streamrec.snapshot import (DENSE, MANIFEST, Manifest, SnapshotError, iter_rows, load_program, probe_inputs,
                                read_dense)

from .rows import MemoryRows

log = logging.getLogger("streamrec.serving")

SERVED = "served.json"  # written last: its presence marks a complete version directory
MEMORY_IDS = "memory-ids.npz"
MEMORY_ROWS = "memory-rows.npz"  # a compressed version's memory rows as the snapshot carried them (not re-encoded)
STORED_FORMAT = 2  # served.json records every file of the directory (format 1 recorded three, not the store)
UNRECORDED = ("LOCK", "LOG")  # RocksDB's lock file and info log: no rows in them, rewritten by any open
HASH_THREADS = 4  # files hashed at once when a version is verified (hashlib releases the GIL)


class StoredVersionDamaged(SnapshotError):
    """A stored version's file differs from what was recorded when it was installed (DATA_LOSS)."""

    def __init__(self, version: int, file: str, what: str):
        super().__init__(f"{file}: {what} (corrupt stored version {version})", code="DATA_LOSS")
        self.version = version
        self.file = file


def _recorded(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return not (name in UNRECORDED or name.startswith("LOG.old") or name in (SERVED, SERVED + ".tmp"))


def stored_files(vdir: Path) -> list[str]:
    """Relative paths (``/``-separated) of the files of a version directory that its record covers."""
    out = []
    for p in vdir.rglob("*"):
        if p.is_file() or p.is_symlink():
            rel = p.relative_to(vdir).as_posix()
            if _recorded(rel):
                out.append(rel)
    return sorted(out)


def record_files(vdir: Path, known: dict[str, tuple] | None = None) -> dict[str, dict]:
    """``{file: {"bytes", "sha256"}}`` of every recorded file of ``vdir``. ``known``: file -> ((st_dev, st_ino),
    record) of files hard-linked from a parent whose record was verified just before: the same inode is the
    same bytes, so its record is reused instead of hashing it again."""
    out, todo = {}, []
    for rel in stored_files(vdir):
        st = os.stat(vdir / rel)
        k = (known or {}).get(rel)
        if k is not None and k[0] == (st.st_dev, st.st_ino) and k[1]["bytes"] == st.st_size:
            out[rel] = dict(k[1])
        else:
            todo.append((rel, st.st_size))
    if todo:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(HASH_THREADS, len(todo))) as pool:
            for (rel, size), digest in zip(todo, pool.map(lambda t: sha256_file(vdir / t[0]), todo)):
                out[rel] = {"bytes": int(size), "sha256": digest}
    return out


def verify_files(vdir: Path, recorded: dict[str, dict], version: int) -> int:
    """Check every file of ``vdir`` against ``recorded`` (sizes first, then one sha256 per file); returns the
    bytes hashed. Raises ``StoredVersionDamaged`` naming the first file that is missing, differs, or is not
    recorded (an unrecorded RocksDB log or table would be read as rows)."""
    present = set(stored_files(vdir))
    for rel in sorted(present - set(recorded)):
        raise StoredVersionDamaged(version, rel, f"not recorded in {SERVED} at install")
    for rel, info in sorted(recorded.items()):
        if rel not in present:
            raise StoredVersionDamaged(version, rel, "missing")
        size = os.stat(vdir / rel).st_size
        if size != info["bytes"]:
            raise StoredVersionDamaged(version, rel, f"{size} bytes, {SERVED} recorded {info['bytes']}")
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(recorded)
    with ThreadPoolExecutor(max(1, min(HASH_THREADS, len(names)))) as pool:
        for rel, digest in zip(names, pool.map(lambda r: sha256_file(vdir / r), names)):
            if digest != recorded[rel]["sha256"]:
                raise StoredVersionDamaged(version, rel, f"sha256 does not match {SERVED}")
    return sum(int(i["bytes"]) for i in recorded.values())


class Refused(SnapshotError):
    """A snapshot refused for what it holds (non-finite weights, a model too big): ``load_version`` answers it
    with its own code instead of DATA_LOSS (a full snapshot of the same model would be refused the same way)."""


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    try:
        return build_model_config(d)
    except ConfigError as e:
        raise SnapshotError(f"manifest.model_config: {e}", code="INVALID_ARGUMENT") from None


def _refusal(e: ConfigError) -> str:
    """Why serving cannot build the model a snapshot without a program needs, naming the real cause: the
    module does not import here, or its builder or its forward on the probe batch fails."""
    stage = getattr(e, "stage", "build")
    if stage == "import":
        return (f"{e}: the snapshot carries no exported program, so serving builds the model from its code, "
                "which must be importable where serving runs")
    return f"{e} (serving builds the model from its code: the snapshot carries no exported program)"


def model_params(mc: ModelConfig, program: bool = False) -> int:
    """Dense parameters ``build_model(mc)`` would allocate, counted by building it on the ``meta`` device
    (shapes only, no memory), so every architecture and a user's module are counted by their own code.
    A ``model.module`` that cannot be imported here, or whose builder fails, is refused naming the cause:
    serving builds the same model to load the snapshot. Its forward is not run here (no forward can read a
    value on the meta device): :func:`built_model` probes it on the CPU.

    ``program``: the snapshot carries an exported program, so serving never imports or builds the module;
    its parameters are counted from ``dense.safetensors`` when it arrives (``check_program_weights``), and
    here only a lower bound is given: a network reading ``dense_dim + pooled_dim`` inputs has at least
    that many weights."""
    if program:
        return int(mc.dense_dim) + int(mc.pooled_dim)
    try:
        with torch.device("meta"):
            model = build_model(mc, probe=False)
    except ConfigError as e:
        raise SnapshotError(f"manifest.model_config: {_refusal(e)}", code="INVALID_ARGUMENT") from None
    return sum(p.numel() for p in model.parameters())


def built_model(mc: ModelConfig) -> RankingModel:
    """The model of a snapshot without an exported program, built from its code on the CPU and checked on a
    real probe batch there (``build_model``), so a forward that branches on a value is run as it will be on
    requests; ``Refused`` (INVALID_ARGUMENT) naming the cause when it cannot be built or fails the probe."""
    try:
        with torch.device("cpu"):
            return build_model(mc)
    except ConfigError as e:
        raise Refused(f"manifest.model_config: {_refusal(e)}", code="INVALID_ARGUMENT") from None


def check_model_config(d: Any, limits, program: bool = False) -> ModelConfig:
    """A pushed manifest's ``model_config`` within the serving limits (``serving.max_model_fields``,
    ``max_embedding_dim``, ``max_model_params``), checked before anything is allocated for it."""
    def bad(msg: str):
        raise SnapshotError(f"manifest.model_config: {msg}", code="INVALID_ARGUMENT")

    if not isinstance(d, dict):
        bad("must be an object")
    fields = d.get("fields")
    if isinstance(fields, list) and len(fields) > limits.max_model_fields:
        bad(f"{len(fields)} fields, serving.max_model_fields allows {limits.max_model_fields}")
    mc = model_config_from_dict(d)
    for f in mc.fields:
        if len(f.name) > 128:
            bad(f"field name {f.name[:40]!r}... is longer than 128 characters")
    if mc.embedding_dim > limits.max_embedding_dim:
        bad(f"embedding_dim {mc.embedding_dim}, serving.max_embedding_dim allows {limits.max_embedding_dim}")
    for key in ("bottom_mlp", "top_mlp"):
        if any(x < 1 for x in getattr(mc, key)):
            bad(f"{key}: every layer needs at least 1 unit, got {getattr(mc, key)}")
    for t, dim in mc.tables.items():
        if dim > limits.max_embedding_dim:
            bad(f"table {t!r} has dim {dim}, serving.max_embedding_dim allows {limits.max_embedding_dim}")
    dlrm = mc.architecture == "dlrm" and not mc.module and not program  # the dot interaction needs the dense vector at embedding_dim
    if dlrm and mc.dense_dim and not mc.bottom_mlp and mc.dense_dim != mc.embedding_dim:
        bad(f"dense_dim {mc.dense_dim} without a bottom MLP must equal embedding_dim {mc.embedding_dim}")
    if not 0 <= mc.seed < 2**63:
        bad(f"seed must be in 0..2^63-1, got {mc.seed}")
    params = model_params(mc, program)
    if params > limits.max_model_params:
        bad(f"the model has {params} dense parameters, serving.max_model_params allows {limits.max_model_params}")
    return mc


def check_dense_state(state: dict) -> None:
    """Every dense tensor floating point and finite: a NaN or inf weight would be served as NaN scores."""
    for k, t in state.items():
        if not t.is_floating_point():
            raise Refused(f"{DENSE}: tensor {k!r} is {t.dtype}, expected floating point", code="INVALID_ARGUMENT")
        if not bool(torch.isfinite(t).all()):
            raise Refused(f"{DENSE}: tensor {k!r} holds non-finite values (NaN or inf)", code="INVALID_ARGUMENT")


def check_program_weights(state: dict, limits) -> None:
    """A program's weights (``dense.safetensors``) within ``serving.max_model_params``."""
    params = sum(t.numel() for t in state.values())
    if params > limits.max_model_params:
        raise Refused(f"{DENSE}: {params} dense parameters, serving.max_model_params allows {limits.max_model_params}",
                      code="INVALID_ARGUMENT")


class Program:
    """A version's exported dense network: the serialized program and constants (as received, persisted with
    the version) and its module with the version's weights."""

    def __init__(self, entry: dict, program_json: bytes, constants: dict[str, torch.Tensor], module):
        self.entry = entry
        self.sha256 = entry["sha256"]
        self.program_json = program_json
        self.constants = constants
        self.module = module


def _program_files(directory: Path, manifest: Manifest) -> tuple[bytes, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    p = manifest.program
    blob = (directory / p["file"]).read_bytes()
    consts = {}
    if p.get("constants"):
        try:
            consts = load_file(str(directory / p["constants"]))
        except Exception as e:  # safetensors raises several types on bad bytes
            raise Refused(f"{p['constants']}: cannot be read: {str(e)[:200]}", code="INVALID_ARGUMENT") from None
    return blob, consts


def load_checked_program(manifest: Manifest, model_cfg: ModelConfig, program_json: bytes,
                         constants: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                         device: torch.device) -> Program:
    """The manifest's program with ``state`` as its weights, checked before it may serve: its declared inputs
    are the model config's ``[B, dense_dim]`` and ``[B, pooled_dim]``, its output one logit per task, and run on
    the probe batch it gives logits ``[rows, tasks]`` equal (within ``PROBE_RTOL``/``PROBE_ATOL``) to those the
    trainer recorded. Anything else is ``Refused`` (INVALID_ARGUMENT) naming the problem."""
    from streamrec.snapshot.program import PROBE_ATOL, PROBE_RTOL

    p = manifest.program
    tasks = manifest.tasks or list(model_cfg.task_names)

    def bad(msg: str):
        raise Refused(f"program: {msg}", code="INVALID_ARGUMENT")

    if tasks != list(model_cfg.task_names):
        bad(f"the manifest's tasks {tasks} differ from model_config's {list(model_cfg.task_names)}")
    widths = [i["shape"][1] for i in p["inputs"]]
    if widths != [model_cfg.dense_dim, model_cfg.pooled_dim]:
        bad(f"inputs of widths {widths}, the model config gives dense_dim {model_cfg.dense_dim} and pooled_dim "
            f"{model_cfg.pooled_dim}")
    if p["outputs"][0]["shape"][1] != len(tasks):
        bad(f"{p['outputs'][0]['shape'][1]} logits per event, the model has {len(tasks)} tasks ({', '.join(tasks)})")
    if hashlib.sha256(program_json).hexdigest() != p["sha256"]:
        bad(f"{p['file']}: sha256 differs from the manifest's program.sha256")
    try:  # every tensor on the device before the module is made: its constants are not all buffers `.to` moves
        module = load_program(program_json, {k: v.to(device) for k, v in state.items()},
                              {k: v.to(device) for k, v in constants.items()})
    except SnapshotError as e:
        raise Refused(str(e), code="INVALID_ARGUMENT") from None
    rows = int(p["probe_rows"])
    dense, pooled = probe_inputs(model_cfg.dense_dim, model_cfg.pooled_dim, rows=rows, device=device)
    try:
        with torch.no_grad():
            out = module(dense, pooled)
    except Exception as e:  # the program's own failure on valid inputs
        bad(f"raises on the probe batch [{rows}, {model_cfg.dense_dim}], [{rows}, {model_cfg.pooled_dim}]: "
            f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, len(tasks)):
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        bad(f"returns {shape} on the probe batch of {rows}, expected [{rows}, {len(tasks)}] (one logit per task)")
    want = torch.tensor(p["probe_logits"], dtype=torch.float32)
    got = out.detach().float().cpu()
    if not torch.allclose(got, want, rtol=PROBE_RTOL, atol=PROBE_ATOL):
        bad(f"its logits on the probe batch differ from the trainer's (max |diff| "
            f"{float((got - want).abs().max()):.3g})")
    return Program(dict(p), program_json, constants, module)


def _strip_input_check(module):
    """``module`` (an exported program's) prepared for tracing: without torch.export's input-constraint
    pre-hook, which the TorchScript tracer cannot run (serving checks a request's widths itself, before any
    forward), and with each ``view``/``reshape`` of a tensor to ``[its own size(0), n, ...]`` (all ``n`` > 0)
    written as ``[-1, n, ...]``: the same tensor, but a trace no longer fixes the batch size it saw."""
    hooks = getattr(module, "_forward_pre_hooks", {})
    for k, h in list(hooks.items()):
        if getattr(h, "__name__", "") == "_check_input_constraints_pre_hook":
            del hooks[k]
    graph = getattr(module, "graph", None)
    if graph is None:
        return module
    aten = torch.ops.aten
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (aten.view.default, aten.reshape.default):
            continue
        src, shape = node.args[0], node.args[1]
        if not isinstance(shape, (list, tuple)) or not shape or not isinstance(shape[0], torch.fx.Node):
            continue
        first = shape[0]
        if (first.op == "call_function" and first.target == aten.sym_size.int and tuple(first.args) == (src, 0)
                and all(type(x) is int and x > 0 for x in shape[1:])):
            node.args = (src, [-1, *shape[1:]])
    module.recompile()
    return module


def scoring_forward(model: RankingModel, model_cfg: ModelConfig, device: torch.device, traced=None):
    """The forward a version scores with: a frozen TorchScript trace of ``model`` (weights folded in, no
    Python module calls, so faster per batch than eager) when it gives the eager forward's scores bit for
    bit on a probe batch, run past the executor's profiling runs and at several batch sizes; else
    ``model`` itself. So scores never depend on which one runs. The trace is built once per loaded
    version (a delta too: its weights are folded in). ``traced``: the module to trace when it is not
    ``model`` itself (an exported program's module without its input check), its scores compared with
    ``model``'s. A user's module built from its code (no program) always scores eager: its trainer could
    not export it, which most often means Python control flow on values, and a trace would fix the branch
    the probe batch took."""
    import warnings

    if traced is None and model_cfg.module:
        return model

    g = torch.Generator().manual_seed(0)
    dense = torch.randn(64, model_cfg.dense_dim, generator=g).to(device)
    pooled = torch.randn(64, model_cfg.pooled_dim, generator=g).to(device)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on constants: the probe below is the check
            frozen = torch.jit.freeze(torch.jit.trace(traced if traced is not None else model, (dense, pooled),
                                                      check_trace=False).eval())
            for _ in range(3):
                for b in (1, 5, 64):
                    if not torch.equal(frozen(dense[:b], pooled[:b]), model(dense[:b], pooled[:b])):
                        log.warning("the frozen forward differs from the eager one on the probe batch: scoring eager")
                        return model
    except Exception as e:  # any trace/freeze failure: the eager forward is always right
        log.warning("freezing the forward failed (%s: %s): scoring eager", type(e).__name__, str(e)[:200])
        return model
    return frozen


class ServedVersion:
    """A model (dense weights), its in-memory rows and its own embedding store; safe to score from many threads.

    ``rows_held``: distinct embedding rows this version holds, i.e. rows a snapshot
    gave it (a full snapshot's rows; a delta adds the ids its parent did not hold).
    A row whose vector equals the deterministic init of an unseen id is
    indistinguishable from one not held, and counts as not held when a delta
    brings it.
    """

    def __init__(self, manifest: Manifest, model: RankingModel, store, model_cfg: ModelConfig, dense_state: dict,
                 directory: Path, rows_held: int, device: torch.device, memory: MemoryRows | None = None,
                 files: dict[str, dict] | None = None, program: Program | None = None):
        self.manifest = manifest
        self.program = program  # the exported dense network it scores with; None: the module built from config
        self.tasks = list(manifest.tasks or model_cfg.task_names)
        self.files = dict(files or {})  # what served.json records: file -> {"bytes", "sha256"}
        self.verified: tuple[int, float] | None = None  # (bytes, seconds) of the check at restore
        self.version = manifest.version
        self.model = model
        # bit-identical to model(...), faster. A program scores through a copy without torch.export's Python
        # input check (it costs as much as a small network's forward; serving checks the widths itself)
        self.forward = scoring_forward(_strip_input_check(_program_copy(program, device)) if program else model,
                                       model_cfg, device)
        self.store = store
        self.model_cfg = model_cfg
        self.fields = list(model_cfg.field_names)
        self.dense_dim = model_cfg.dense_dim
        self.dense_state = dense_state
        self.directory = directory
        self.rows_held = rows_held
        self.device = device
        self.memory = memory if memory is not None else MemoryRows.build(
            model_cfg.field_tables, model_cfg.tables, device, {})
        self.loaded_ms = int(time.time() * 1000)
        # the trainer's store.admit_min_count: an id without a row of its own read the shared row (or zeros) there
        sc = manifest.store_config or {}
        self.unadmitted = (str(sc.get("unadmitted", "shared")) if int(sc.get("admit_min_count", 0) or 0) >= 2
                           else None)
        self._refs = 0
        self._retired = False
        self._closed = False
        self._keep_dir = False
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()  # the store's read path is not promised to be thread-safe

    @property
    def store_lock(self) -> threading.Lock:
        """Held while this version's store is read (its read path is not promised to be thread-safe); a
        delta holds it while it copies the store's files."""
        return self._store_lock

    LOOKUP_CHUNK = 4096  # ids read under one hold of the store lock: a big request does not hold up small ones

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        """Rows of table ``table``'s ``ids`` from the store (every row this version holds; for an id it does not
        hold: its init, or, when the trainer admits ids by frequency, the table's unadmitted value)."""
        if len(ids) <= self.LOOKUP_CHUNK:
            with self._store_lock:
                return self._peek(table, ids)
        parts = []
        for i in range(0, len(ids), self.LOOKUP_CHUNK):
            with self._store_lock:
                parts.append(self._peek(table, ids[i:i + self.LOOKUP_CHUNK]))
        return torch.cat(parts)

    def _peek(self, table: str, ids: np.ndarray) -> torch.Tensor:
        if self.unadmitted is None:
            return self.store.peek(table, ids)
        from streamrec.embedding_store import peek_with_admission

        return peek_with_admission(self.store, table, ids, self.unadmitted == "shared")

    @torch.inference_mode()
    def predict(self, batch) -> np.ndarray:
        """Probabilities ``[events, tasks]`` (column t: task ``tasks[t]``): memory rows + one batched store
        read for the rest, then the forward pass."""
        pooled = self.memory.pooled(batch, self.lookup)
        dense = torch.from_numpy(batch.dense).to(self.device)
        logits = self.forward(dense, pooled)
        if logits.dim() == 1:  # a one-task module returning [B]
            logits = logits.unsqueeze(1)
        return torch.sigmoid(logits).float().cpu().numpy()

    def predict_via_store(self, batch) -> np.ndarray:
        """The trainer's scoring path over the store alone (a cross-check for tests)."""
        return predict_batch(self.model, batch, self.model_cfg, self.lookup, self.device)

    def verify(self) -> tuple[int, float]:
        """Check this version's directory against its record (``verify_files``); returns (bytes hashed,
        seconds). Raises ``StoredVersionDamaged`` naming the file."""
        t0 = time.perf_counter()
        n = verify_files(self.directory, self.files, self.version)
        return n, time.perf_counter() - t0

    def acquire(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            close = self._retired and self._refs == 0 and not self._closed
            if close:
                self._closed = True
        if close:
            self._close()

    def retire(self, keep_dir: bool = False) -> None:
        """No new requests will come; close once the in-flight ones are done.

        ``keep_dir``: keep the directory (a server shutting down, to be restored on restart);
        otherwise it is removed (a newer version replaced this one)."""
        with self._lock:
            self._retired = True
            self._keep_dir = keep_dir
            close = self._refs == 0 and not self._closed
            if close:
                self._closed = True
        if close:
            self._close()

    def _close(self) -> None:
        try:
            with self._store_lock:
                self.store.close()
        except Exception:  # closing must never break serving
            log.exception("closing the store of version %s", self.version)
        if not self._keep_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


def _store_kwargs(store_cfg: StoreConfig, manifest: Manifest, device: torch.device) -> dict:
    """Store settings: ``store_cfg``'s, with the init settings the trainer used (from the manifest).

    The store keeps no hot tier of its own: the version's ``MemoryRows`` are serving's hot rows."""
    kw = dict(device=device, hot_capacity_rows=0, init_scale=float(store_cfg.init_scale),
              block_cache_mb=int(store_cfg.block_cache_mb))
    if "init_scale" in (manifest.store_config or {}):  # decides the initial vector of unseen ids
        kw["init_scale"] = float(manifest.store_config["init_scale"])
    # per-table scales (the fields' expected_ids / init_scale) are part of the model config
    kw["init_scale"] = model_config_from_dict(manifest.model_config).init_scales(kw["init_scale"])
    return kw


def _program_copy(program: Program, device: torch.device):
    """A second module of ``program`` (the traced one may be altered; the checked one stays as it is)."""
    return load_program(program.program_json, dict(program.module.state_dict()),
                        {k: v.to(device) for k, v in program.constants.items()})


def _new_store(model_cfg: ModelConfig, store_cfg: StoreConfig, manifest: Manifest, device: torch.device, path: Path):
    from streamrec.embedding_store import EmbeddingStore, StoreSpec

    tables = dict(model_cfg.tables)  # a table several fields share is stored once
    return EmbeddingStore(StoreSpec(str(path), tables, shards=store_cfg.shards, seed=model_cfg.seed,
                                    **_store_kwargs(store_cfg, manifest, device)))


def _store_from_parent(parent: "ServedVersion", store_cfg: StoreConfig, manifest: Manifest, device: torch.device,
                       path: Path) -> tuple[Any, dict[str, tuple]]:
    """A copy of the parent's (read-only, closed for writes) store opened writable as this version's own:
    SST files are hard-linked (RocksDB never writes an SST once made, and the copy's new ones get new
    names), every other file is copied, so writing the copy never changes a byte of the parent. Returns the
    store and, per hard-linked file, ((st_dev, st_ino), the parent's record) for ``record_files``."""
    from streamrec.embedding_store import EmbeddingStore

    src = parent.directory / "store"
    known: dict[str, tuple] = {}
    with parent.store_lock:
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src)
            dest = path / rel
            if p.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            if not _recorded(rel.as_posix()):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if p.suffix == ".sst":
                try:
                    os.link(p, dest)
                    st = os.stat(dest)
                    rec = parent.files.get(f"store/{rel.as_posix()}")
                    if rec is not None:
                        known[f"store/{rel.as_posix()}"] = ((st.st_dev, st.st_ino), rec)
                    continue
                except OSError as e:
                    if resource_error_line(e):
                        raise
                    # another file system or no hard links there: copy it
            shutil.copyfile(p, dest)
    return EmbeddingStore.restore(str(path), **_store_kwargs(store_cfg, manifest, device)), known


def _apply_deletions(staged: Path, manifest: Manifest, store, parts: dict) -> int:
    """Drop the rows a delta deletes (``deleted.parquet``) from the version's store copy and from the memory
    rows it starts from; returns how many rows the store held of them."""
    from streamrec.snapshot import iter_deleted

    n = 0
    for table, ids in iter_deleted(staged, manifest):
        if table not in store.tables:
            raise SnapshotError(f"deleted: table {table!r} is not a table of the model", code="INVALID_ARGUMENT")
        n += store.delete_rows(table, ids)
        if table in parts:
            parts[table] = [_without(pid, enc, ids) for pid, enc in parts[table]]
    return n


def _without(ids: np.ndarray, enc, drop: np.ndarray) -> tuple:
    """A memory part ``(ids, encoded arrays)`` without the rows of ``drop``."""
    keep = ~np.isin(ids, drop)
    if keep.all():
        return ids, enc
    return ids[keep], ({k: a[keep] for k, a in enc.items()} if isinstance(enc, dict) else enc[keep])


def _open_stored(vdir: Path, store_cfg: StoreConfig, manifest: Manifest, device: torch.device):
    """A stored version's store, opened read-only: serving never writes an installed version."""
    from streamrec.embedding_store import EmbeddingStore

    return EmbeddingStore.restore(str(vdir / "store"), read_only=True, **_store_kwargs(store_cfg, manifest, device))


def _persist(vdir: Path, manifest: Manifest, state: dict, memory: MemoryRows, rows_held: int,
             known: dict[str, tuple] | None = None, program: Program | None = None) -> dict[str, dict]:
    """What a restart needs to serve this version again, then ``served.json`` last: the record of every file
    (its store closed before, so no byte changes after). Returns that record."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(vdir / DENSE))
    if program is not None:  # a delta's program is its parent's: each version directory holds its own copy
        (vdir / program.entry["file"]).write_bytes(program.program_json)
        if program.entry.get("constants"):
            save_file({k: v.detach().cpu().contiguous() for k, v in program.constants.items()},
                      str(vdir / program.entry["constants"]))
    (vdir / MANIFEST).write_bytes(manifest.to_json())
    save_npz(vdir / MEMORY_IDS, {t: memory.ids[t] for t in memory.tables})  # not np.savez(**): a table may be named "file"
    if memory.precision != "fp32":
        save_npz(vdir / MEMORY_ROWS, memory.encoded())
    files = record_files(vdir, known)
    info = {"format": STORED_FORMAT, "version": manifest.version, "rows_held": int(rows_held), "files": files}
    tmp = vdir / (SERVED + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, vdir / SERVED)
    fd = os.open(vdir, os.O_RDONLY)  # the rename itself survives a power loss
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return files


def check_delta(manifest: Manifest, parent: ServedVersion | None, model_cfg: ModelConfig) -> None:
    """A delta fits the version it builds on: that is the parent it names, with the same model config, row
    precision and program (a delta carries only changed rows and weights). Anything else is
    FAILED_PRECONDITION, which tells the trainer to send a full snapshot."""
    if parent is None or parent.version != manifest.parent_version:
        have = "none" if parent is None else parent.version
        raise SnapshotError(f"delta {manifest.version} needs parent {manifest.parent_version}, serving {have}; send a full snapshot", code="FAILED_PRECONDITION")
    if parent.model_cfg != model_cfg:
        raise SnapshotError("delta's model_config differs from its parent's; send a full snapshot", code="FAILED_PRECONDITION")
    if parent.manifest.row_precision != manifest.row_precision:
        raise SnapshotError(f"delta's row_precision {manifest.row_precision} differs from its parent's "
                            f"{parent.manifest.row_precision}; send a full snapshot", code="FAILED_PRECONDITION")
    have = parent.program.sha256 if parent.program is not None else None
    if have != (manifest.program or {}).get("sha256"):
        raise SnapshotError("delta's program differs from its parent's (a delta carries only weights); send a full "
                            "snapshot", code="FAILED_PRECONDITION")


def _dense_network(staged: Path, manifest: Manifest, parent: ServedVersion | None, model_cfg: ModelConfig,
                   limits: ServingConfig, device: torch.device) -> tuple[dict, Program | None, Any]:
    """The version's dense weights (a delta's merged over its parent's), every tensor finite, and the network
    that scores with them: ``(state, program, model)``, the manifest's exported program (the user's code is
    never imported) or else the model built from its config."""
    state = read_dense(staged)
    check_dense_state(state)
    if manifest.kind == "delta":
        state = {**parent.dense_state, **state}
    if manifest.program is not None:
        check_program_weights(state, limits)
        if manifest.kind == "delta":
            blob, consts = parent.program.program_json, parent.program.constants
        else:
            blob, consts = _program_files(staged, manifest)
        program = load_checked_program(manifest, model_cfg, blob, consts, state, device)
        return state, program, program.module
    model = built_model(model_cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise SnapshotError(f"dense.safetensors does not fit the model: {str(e)[:300]}", code="INVALID_ARGUMENT") from None
    model.to(device).eval()
    return state, None, model


def _checked_rows(table: str, ids: np.ndarray, vectors: np.ndarray, dims: dict[str, int]) -> np.ndarray:
    """A snapshot's rows of ``table`` as contiguous float32, refused when the model has no such table, their
    width differs from the table's, or a row is not finite."""
    if table not in dims:
        raise SnapshotError(f"rows: table {table!r} is not a table of the model", code="INVALID_ARGUMENT")
    if vectors.shape[1] != dims[table]:
        raise SnapshotError(f"rows: table {table!r} has width {vectors.shape[1]}, model has {dims[table]}", code="INVALID_ARGUMENT")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise Refused(f"rows: table {table!r} id {int(ids[np.argmin(finite)])} has non-finite values "
                      "(NaN or inf)", code="INVALID_ARGUMENT")
    return vectors


def _load_rows(staged: Path, manifest: Manifest, dims: dict[str, int], store, parts: dict,
               old_memory: MemoryRows | None, rows_held: int, hot_rows: int) -> int:
    """Write the snapshot's rows into the version's store and add them to the memory ``parts`` (rows already
    in memory are updated; new ones join while fewer than ``hot_rows`` are held). Returns ``rows_held`` plus
    the rows new to this version: a delta's changed row its parent held counts once."""
    room = int(hot_rows) - sum(len(p[0]) for ps in parts.values() for p in ps)
    for table, ids, vectors, enc in iter_rows(staged, manifest, dim=dims, encoded=True):
        vectors = _checked_rows(table, ids, vectors, dims)
        if old_memory is None:
            rows_held += len(ids)
            in_memory = np.zeros(len(ids), dtype=bool)
        else:  # exact count: a changed row the parent held is not a new row
            in_memory = old_memory.contains(table, ids)
            rest = ids[~in_memory]
            if len(rest):
                held = np.any(store.peek(table, rest).numpy() != store.init_rows(table, rest), axis=1)
                rows_held += int((~held).sum())
        store.upsert_rows(table, ids, vectors)
        take = in_memory.copy()
        if room > 0:
            new_pos = np.flatnonzero(~in_memory)[:room]
            take[new_pos] = True
            room -= len(new_pos)
        if take.any():
            parts.setdefault(table, []).append((ids[take], {k: a[take] for k, a in enc.items()}))
    return rows_held


def _raise_install_error(e: BaseException, manifest: Manifest, vdir: Path) -> None:
    """Raise what a failed install answers the pusher, or return when ``e`` is answered as it is (a
    ``Refused`` snapshot, or a fault of serving's own): the machine's fault (disk full, read-only, no file
    handles) is a resource error, never a verdict on the snapshot; any other ``SnapshotError`` is DATA_LOSS,
    and rows the store refuses are INVALID_ARGUMENT."""
    err = as_resource_error(e, f"installing version {manifest.version}", str(vdir)) \
        if isinstance(e, Exception) else None
    if err is not None:
        raise err from e
    if isinstance(e, Refused):
        return
    if isinstance(e, SnapshotError):
        raise SnapshotError(str(e), code="DATA_LOSS") from None
    from streamrec.embedding_store import StoreError

    if isinstance(e, StoreError):
        raise SnapshotError(f"rows: {e}", code="INVALID_ARGUMENT") from None


def load_version(staged: Path, manifest: Manifest, parent: ServedVersion | None, versions_root: Path,
                 serving: ServingConfig, store_cfg: StoreConfig, device: torch.device) -> ServedVersion:
    """Build a served version from a verified snapshot directory (and its parent for a delta), within the
    ``serving`` limits; its store opens with ``store_cfg``'s settings (:func:`_store_kwargs`)."""
    model_cfg = check_model_config(manifest.model_config, serving, program=manifest.program is not None)
    if manifest.kind == "delta":
        check_delta(manifest, parent, model_cfg)
    vdir = versions_root / f"v{manifest.version:012d}"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    store = None
    try:
        state, program, model = _dense_network(staged, manifest, parent, model_cfg, serving, device)
        dims = dict(model_cfg.tables)
        if manifest.kind == "delta":
            store, known = _store_from_parent(parent, store_cfg, manifest, device, vdir / "store")
            parts, old_memory = parent.memory.parts(), parent.memory
            rows_held = parent.rows_held - _apply_deletions(staged, manifest, store, parts)
        else:
            store, known = _new_store(model_cfg, store_cfg, manifest, device, vdir / "store"), None
            parts, old_memory, rows_held = {}, None, 0
        rows_held = _load_rows(staged, manifest, dims, store, parts, old_memory, rows_held, serving.hot_rows)
        memory = MemoryRows.build(model_cfg.field_tables, dims, device, parts, manifest.row_precision)
        store.close()  # every write done: from here on the version is recorded and read-only
        store = None
        files = _persist(vdir, manifest, state, memory, rows_held, known, program)
        store = _open_stored(vdir, store_cfg, manifest, device)
        version = ServedVersion(manifest, model, store, model_cfg, {k: v.detach().clone() for k, v in state.items()},
                                vdir, rows_held, device, memory, files, program)
        if manifest.row_probe is not None:  # refused: the except below closes the store and removes vdir
            from .rowprobe import row_probe_problem

            problem = row_probe_problem(version, manifest.row_probe)
            if problem is not None:
                raise Refused(problem, code="INVALID_ARGUMENT")
        return version
    except BaseException as e:
        if store is not None:
            try:
                store.close()
            except Exception:
                pass
        shutil.rmtree(vdir, ignore_errors=True)
        _raise_install_error(e, manifest, vdir)
        raise


def restore_version(vdir: Path, store_cfg: StoreConfig, device: torch.device) -> ServedVersion:
    """Open a complete version directory a previous server process left (its store with ``store_cfg``'s
    settings); raises on anything amiss."""
    from safetensors.torch import load_file

    marker = vdir / SERVED
    if not marker.exists():
        raise SnapshotError(f"no {SERVED} (half-written)", code="DATA_LOSS")
    try:
        info = json.loads(marker.read_text())
        n = int(info["version"])
        files = info["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise SnapshotError(f"{SERVED}: unreadable ({type(e).__name__}: {e}) (corrupt)", code="DATA_LOSS") from None
    if info.get("format") != STORED_FORMAT:
        raise SnapshotError(f"{SERVED}: format {info.get('format')} records no checksums of the store's files, so "
                            "the version cannot be verified; it needs a full snapshot", code="DATA_LOSS")
    t0 = time.perf_counter()
    n_bytes = verify_files(vdir, files, n)
    verified = (n_bytes, time.perf_counter() - t0)
    manifest = Manifest.from_json((vdir / MANIFEST).read_bytes())
    if manifest.version != info["version"]:
        raise SnapshotError(f"{MANIFEST} is version {manifest.version}, {SERVED} says {info['version']}", code="DATA_LOSS")
    model_cfg = model_config_from_dict(manifest.model_config)
    state = load_file(str(vdir / DENSE))
    program = None
    if manifest.program is not None:
        blob, consts = _program_files(vdir, manifest)
        program = load_checked_program(manifest, model_cfg, blob, consts, state, device)
        model = program.module
    else:
        model = built_model(model_cfg)
        model.load_state_dict(state, strict=True)
        model.to(device).eval()
    store = _open_stored(vdir, store_cfg, manifest, device)
    try:
        parts = {}
        with np.load(vdir / MEMORY_IDS) as z:
            ids = {t: z[t] for t in model_cfg.tables if t in z.files}
        if manifest.row_precision != "fp32":  # the rows as the snapshot carried them: re-encoding may differ
            with np.load(vdir / MEMORY_ROWS) as z:
                enc = {k: z[k] for k in z.files}
            memory = MemoryRows(model_cfg.field_tables, model_cfg.tables, ids, torch.from_numpy(enc["vector"]).to(device),
                                *[torch.from_numpy(enc[k]).to(device) for k in ("scale", "bias") if k in enc])
        else:
            for t, t_ids in ids.items():
                if len(t_ids):
                    parts[t] = [(t_ids, store.peek(t, t_ids).cpu().numpy())]
            memory = MemoryRows.build(model_cfg.field_tables, model_cfg.tables, device, parts)
    except BaseException:
        store.close()
        raise
    v = ServedVersion(manifest, model, store, model_cfg, state, vdir, int(info["rows_held"]), device, memory, files,
                      program)
    v.verified = verified
    return v


def restore_newest(versions_root: Path, store_cfg: StoreConfig, device: torch.device,
                   skipped: list | None = None, keep: set[int] | None = None) -> ServedVersion | None:
    """The newest complete version under ``versions_root`` that verifies (None if there is none).

    Half-written directories (no ``served.json``) and directories older than the one
    restored are removed, except the versions in ``keep`` (the served and kept versions a
    rollback may need, ``history.py``); a complete one that fails its checks or to open is
    skipped and left in place (evidence for the operator), and ``(version, exception)`` is
    appended to ``skipped``."""
    dirs = []
    for p in versions_root.glob("v*"):
        try:
            dirs.append((int(p.name[1:]), p))
        except ValueError:
            continue
    dirs.sort(reverse=True)
    found = None
    for n, p in dirs:
        if found is not None:
            if n not in (keep or ()):
                shutil.rmtree(p, ignore_errors=True)  # superseded by the one restored
            continue
        if not (p / SERVED).exists():
            log.warning("skipping version directory %s: half-written (no %s); removing it", p, SERVED)
            shutil.rmtree(p, ignore_errors=True)
            continue
        try:
            found = restore_version(p, store_cfg, device)
            log.info("restored version %d from %s (%d rows held)", found.version, p, found.rows_held)
        except Exception as e:  # any failure: skip it, try the next older one
            name = "SnapshotError" if isinstance(e, SnapshotError) else type(e).__name__
            level = logging.ERROR if isinstance(e, StoredVersionDamaged) else logging.WARNING
            log.log(level, "skipping version directory %s: %s: %s", p, name, e)
            if skipped is not None:
                skipped.append((n, e))
    return found
