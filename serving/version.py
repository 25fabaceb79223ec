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

Restart: a loaded version also writes its merged dense weights, its manifest and
its memory-row ids into its directory, then ``served.json`` last (atomically), so
a directory with ``served.json`` is complete. ``restore_newest`` serves the
newest complete one after a restart and skips (with a log line) any that is
half-written or fails its checks.
"""

from __future__ import annotations

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

from streamrec.foundation import Config, ConfigError, ModelConfig, load_config, save_npz, sha256_file
from streamrec.model import DLRM, predict_batch
from streamrec.snapshot import DENSE, MANIFEST, Manifest, SnapshotError, iter_rows, read_dense

from .rows import MemoryRows

log = logging.getLogger("streamrec.serving")

SERVED = "served.json"  # written last: its presence marks a complete version directory
MEMORY_IDS = "memory-ids.npz"


class Refused(SnapshotError):
    """A snapshot refused for what it holds (non-finite weights, a model too big): ``load_version`` answers it
    with its own code instead of DATA_LOSS (a full snapshot of the same model would be refused the same way)."""


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    try:
        return load_config(None, {f"model.{k}": v for k, v in d.items()}, env={}).model
    except ConfigError as e:
        raise SnapshotError(f"manifest.model_config: {e}", code="INVALID_ARGUMENT") from None


def dlrm_params(mc: ModelConfig) -> int:
    """Dense parameters ``DLRM.from_config(mc)`` would allocate, counted without allocating."""
    def mlp(sizes):
        return sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))

    n = len(mc.fields) + (1 if mc.dense_dim else 0)
    top_in = n * (n - 1) // 2 + (mc.embedding_dim if mc.dense_dim else 0)
    return (mlp([mc.dense_dim, *mc.bottom_mlp]) if mc.dense_dim else 0) + mlp([top_in, *mc.top_mlp, 1])


def check_model_config(d: Any, limits) -> ModelConfig:
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
    if mc.dense_dim and not mc.bottom_mlp and mc.dense_dim != mc.embedding_dim:
        bad(f"dense_dim {mc.dense_dim} without a bottom MLP must equal embedding_dim {mc.embedding_dim}")
    if not 0 <= mc.seed < 2**63:
        bad(f"seed must be in 0..2^63-1, got {mc.seed}")
    params = dlrm_params(mc)
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


def scoring_forward(model: DLRM, model_cfg: ModelConfig, device: torch.device):
    """The forward a version scores with: a frozen TorchScript trace of ``model`` (weights folded in, no
    Python module calls, so faster per batch than eager) when it gives the eager forward's scores bit for
    bit on a probe batch, run past the executor's profiling runs and at several batch sizes; else
    ``model`` itself. So scores never depend on which one runs. The trace is built once per loaded
    version (a delta too: its weights are folded in)."""
    import warnings

    g = torch.Generator().manual_seed(0)
    dense = torch.randn(64, model_cfg.dense_dim, generator=g).to(device)
    pooled = torch.randn(64, len(model_cfg.fields), model_cfg.embedding_dim, generator=g).to(device)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on constants: the probe below is the check
            frozen = torch.jit.freeze(torch.jit.trace(model, (dense, pooled), check_trace=False))
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

    def __init__(self, manifest: Manifest, model: DLRM, store, model_cfg: ModelConfig, dense_state: dict,
                 directory: Path, rows_held: int, device: torch.device, memory: MemoryRows | None = None):
        self.manifest = manifest
        self.version = manifest.version
        self.model = model
        self.forward = scoring_forward(model, model_cfg, device)  # bit-identical to model(...), faster
        self.store = store
        self.model_cfg = model_cfg
        self.fields = list(model_cfg.field_names)
        self.dense_dim = model_cfg.dense_dim
        self.dense_state = dense_state
        self.directory = directory
        self.rows_held = rows_held
        self.device = device
        self.memory = memory if memory is not None else MemoryRows.build(
            self.fields, model_cfg.embedding_dim, device, {})
        self.loaded_ms = int(time.time() * 1000)
        self._refs = 0
        self._retired = False
        self._closed = False
        self._keep_dir = False
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()  # the store's read path is not promised to be thread-safe

    LOOKUP_CHUNK = 4096  # ids read under one hold of the store lock: a big request does not hold up small ones

    def lookup(self, field: str, ids: np.ndarray) -> torch.Tensor:
        """Rows of ``ids`` from the store (every row this version holds; init for unseen ids)."""
        if len(ids) <= self.LOOKUP_CHUNK:
            with self._store_lock:
                return self.store.peek(field, ids)
        parts = []
        for i in range(0, len(ids), self.LOOKUP_CHUNK):
            with self._store_lock:
                parts.append(self.store.peek(field, ids[i:i + self.LOOKUP_CHUNK]))
        return torch.cat(parts)

    @torch.inference_mode()
    def predict(self, batch) -> np.ndarray:
        """Click probabilities: memory rows + one batched store read for the rest, then the forward pass."""
        pooled = self.memory.pooled(batch, self.lookup)
        dense = torch.from_numpy(batch.dense).to(self.device)
        return torch.sigmoid(self.forward(dense, pooled)).float().cpu().numpy()

    def predict_via_store(self, batch) -> np.ndarray:
        """The trainer's scoring path over the store alone (a cross-check for tests)."""
        return predict_batch(self.model, batch, self.fields, self.lookup, self.device)

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


def _store_kwargs(cfg: Config, manifest: Manifest, device: torch.device) -> dict:
    """Store settings: the serving config's, with the init settings the trainer used (from the manifest).

    The store keeps no hot tier of its own: the version's ``MemoryRows`` are serving's hot rows."""
    kw = dict(device=device, hot_capacity_rows=0, init_scale=float(cfg.store.init_scale),
              block_cache_mb=int(cfg.store.block_cache_mb))
    if "init_scale" in (manifest.store_config or {}):  # decides the initial vector of unseen ids
        kw["init_scale"] = float(manifest.store_config["init_scale"])
    # per-table scales (the fields' expected_ids / init_scale) are part of the model config
    kw["init_scale"] = model_config_from_dict(manifest.model_config).init_scales(kw["init_scale"])
    return kw


def _new_store(model_cfg: ModelConfig, cfg: Config, manifest: Manifest, device: torch.device, path: Path):
    from streamrec.embedding_store import EmbeddingStore

    tables = {f.name: model_cfg.embedding_dim for f in model_cfg.fields}
    return EmbeddingStore(str(path), tables, shards=cfg.store.shards, seed=model_cfg.seed,
                          **_store_kwargs(cfg, manifest, device))


def _store_from_parent(parent: "ServedVersion", cfg: Config, manifest: Manifest, device: torch.device, path: Path):
    """A RocksDB checkpoint of the parent's store (hard links), opened as this version's own store."""
    from streamrec.embedding_store import EmbeddingStore

    with parent._store_lock:
        parent.store.checkpoint(str(path))
    return EmbeddingStore.restore(str(path), **_store_kwargs(cfg, manifest, device))


def _persist(vdir: Path, manifest: Manifest, state: dict, memory: MemoryRows, rows_held: int) -> None:
    """What a restart needs to serve this version again; ``served.json`` last."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(vdir / DENSE))
    (vdir / MANIFEST).write_bytes(manifest.to_json())
    save_npz(vdir / MEMORY_IDS, {f: memory.ids[f] for f in memory.fields})  # not np.savez(**): a field may be named "file"
    info = {"format": 1, "version": manifest.version, "rows_held": int(rows_held),
            "files": {n: sha256_file(vdir / n) for n in (DENSE, MANIFEST, MEMORY_IDS)}}
    tmp = vdir / (SERVED + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, vdir / SERVED)


def load_version(staged: Path, manifest: Manifest, parent: ServedVersion | None, versions_root: Path,
                 cfg: Config, device: torch.device) -> ServedVersion:
    """Build a served version from a verified snapshot directory (and its parent for a delta)."""
    model_cfg = check_model_config(manifest.model_config, cfg.serving)
    if manifest.kind == "delta":
        if parent is None or parent.version != manifest.parent_version:
            have = "none" if parent is None else parent.version
            raise SnapshotError(f"delta {manifest.version} needs parent {manifest.parent_version}, serving {have}; send a full snapshot", code="FAILED_PRECONDITION")
        if parent.model_cfg != model_cfg:
            raise SnapshotError("delta's model_config differs from its parent's; send a full snapshot", code="FAILED_PRECONDITION")
    vdir = versions_root / f"v{manifest.version:012d}"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    store = None
    try:
        state = read_dense(staged)
        check_dense_state(state)
        if manifest.kind == "delta":
            merged = dict(parent.dense_state)
            merged.update(state)
            state = merged
        model = DLRM.from_config(model_cfg)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise SnapshotError(f"dense.safetensors does not fit the model: {str(e)[:300]}", code="INVALID_ARGUMENT") from None
        model.to(device).eval()
        fields = list(model_cfg.field_names)
        dim = model_cfg.embedding_dim
        if manifest.kind == "delta":
            store = _store_from_parent(parent, cfg, manifest, device, vdir / "store")
            rows_held = parent.rows_held
            parts = parent.memory.parts()
            old_memory = parent.memory
        else:
            store = _new_store(model_cfg, cfg, manifest, device, vdir / "store")
            rows_held = 0
            parts = {}
            old_memory = None
        room = int(cfg.serving.hot_rows) - sum(len(p[0]) for ps in parts.values() for p in ps)
        tables = set(fields)
        for table, ids, vectors in iter_rows(staged, manifest, dim=dim):
            if table not in tables:
                raise SnapshotError(f"rows: table {table!r} is not a model field", code="INVALID_ARGUMENT")
            if vectors.shape[1] != dim:
                raise SnapshotError(f"rows: table {table!r} has width {vectors.shape[1]}, model has {dim}", code="INVALID_ARGUMENT")
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)
            finite = np.isfinite(vectors).all(axis=1)
            if not finite.all():
                raise Refused(f"rows: table {table!r} id {int(ids[np.argmin(finite)])} has non-finite values "
                              "(NaN or inf)", code="INVALID_ARGUMENT")
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
            # memory: rows already there are updated; new ones join while there is room
            take = in_memory.copy()
            if room > 0:
                new_pos = np.flatnonzero(~in_memory)[:room]
                take[new_pos] = True
                room -= len(new_pos)
            if take.any():
                parts.setdefault(table, []).append((ids[take], vectors[take]))
        memory = MemoryRows.build(fields, dim, device, parts)
        _persist(vdir, manifest, state, memory, rows_held)
        return ServedVersion(manifest, model, store, model_cfg, {k: v.detach().clone() for k, v in state.items()},
                             vdir, rows_held, device, memory)
    except BaseException as e:
        if store is not None:
            try:
                store.close()
            except Exception:
                pass
        shutil.rmtree(vdir, ignore_errors=True)
        if isinstance(e, Refused):
            raise
        if isinstance(e, SnapshotError):
            raise SnapshotError(str(e), code="DATA_LOSS") from None
        from streamrec.embedding_store import StoreError

        if isinstance(e, StoreError):
            raise SnapshotError(f"rows: {e}", code="INVALID_ARGUMENT") from None
        raise


def restore_version(vdir: Path, cfg: Config, device: torch.device) -> ServedVersion:
    """Open a complete version directory a previous server process left; raises on anything amiss."""
    from safetensors.torch import load_file

    from streamrec.embedding_store import EmbeddingStore

    marker = vdir / SERVED
    if not marker.exists():
        raise SnapshotError(f"no {SERVED} (half-written)", code="DATA_LOSS")
    info = json.loads(marker.read_text())
    for name, digest in info["files"].items():
        if sha256_file(vdir / name) != digest:
            raise SnapshotError(f"{name}: sha256 does not match {SERVED} (corrupt)", code="DATA_LOSS")
    manifest = Manifest.from_json((vdir / MANIFEST).read_bytes())
    if manifest.version != info["version"]:
        raise SnapshotError(f"{MANIFEST} is version {manifest.version}, {SERVED} says {info['version']}", code="DATA_LOSS")
    model_cfg = model_config_from_dict(manifest.model_config)
    state = load_file(str(vdir / DENSE))
    model = DLRM.from_config(model_cfg)
    model.load_state_dict(state, strict=True)
    model.to(device).eval()
    store = EmbeddingStore.restore(str(vdir / "store"), **_store_kwargs(cfg, manifest, device))
    try:
        fields = list(model_cfg.field_names)
        parts = {}
        with np.load(vdir / MEMORY_IDS) as z:
            for f in fields:
                if f in z.files and len(z[f]):
                    ids = z[f]
                    parts[f] = [(ids, store.peek(f, ids).cpu().numpy())]
        memory = MemoryRows.build(fields, model_cfg.embedding_dim, device, parts)
    except BaseException:
        store.close()
        raise
    return ServedVersion(manifest, model, store, model_cfg, state, vdir, int(info["rows_held"]), device, memory)


def restore_newest(versions_root: Path, cfg: Config, device: torch.device) -> ServedVersion | None:
    """The newest complete version under ``versions_root`` (None if there is none).

    Half-written directories (no ``served.json``) and directories older than the one
    restored are removed; a complete one that fails to open is skipped and left in place."""
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
            shutil.rmtree(p, ignore_errors=True)  # superseded by the one restored
            continue
        if not (p / SERVED).exists():
            log.warning("skipping version directory %s: half-written (no %s); removing it", p, SERVED)
            shutil.rmtree(p, ignore_errors=True)
            continue
        try:
            found = restore_version(p, cfg, device)
            log.info("restored version %d from %s (%d rows held)", found.version, p, found.rows_held)
        except Exception as e:  # any failure: skip it, try the next older one
            log.warning("skipping version directory %s: %s: %s", p, type(e).__name__, e)
    return found
