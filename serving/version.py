"""One loaded model version, and how a snapshot becomes one.

Staging choice (why deltas never disturb the version being served): every
version owns its own embedding store directory ``versions/v<N>/store``. A full
snapshot loads into a fresh store; a delta first takes a RocksDB checkpoint of
its parent's store (hard links to the immutable SST files, so it costs little
disk and time), opens that copy, and upserts the changed rows there. The parent
store is only read during this, so requests keep being answered from it. The
swap is one reference assignment; each request holds a reference (refcount) to
the version it started on, and a retired version's store is closed and its
directory removed only when its last request has finished.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrec.config import Config, ConfigError, ModelConfig, load_config
from trainer import DLRM, predict_batch

from .snapshot import Manifest, SnapshotError, iter_rows, read_dense

log = logging.getLogger("streamrec.serving")


class LoadError(Exception):
    """A verified snapshot cannot become a served version; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    try:
        return load_config(None, {f"model.{k}": v for k, v in d.items()}, env={}).model
    except ConfigError as e:
        raise LoadError("INVALID_ARGUMENT", f"manifest.model_config: {e}") from None


class ServedVersion:
    """A model (dense weights) plus its own embedding store; safe to score from many threads."""

    def __init__(self, manifest: Manifest, model: DLRM, store, model_cfg: ModelConfig, dense_state: dict,
                 directory: Path, rows_held: int, device: torch.device):
        self.manifest = manifest
        self.version = manifest.version
        self.model = model
        self.store = store
        self.model_cfg = model_cfg
        self.fields = list(model_cfg.field_names)
        self.dense_dim = model_cfg.dense_dim
        self.dense_state = dense_state
        self.directory = directory
        self.rows_held = rows_held
        self.device = device
        self.loaded_ms = int(time.time() * 1000)
        self._refs = 0
        self._retired = False
        self._closed = False
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()  # the store's read path is not promised to be thread-safe

    def lookup(self, field: str, ids: np.ndarray) -> torch.Tensor:
        with self._store_lock:
            return self.store.peek(field, ids)

    def predict(self, batch) -> np.ndarray:
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

    def retire(self) -> None:
        """No new requests will come; close once the in-flight ones are done."""
        with self._lock:
            self._retired = True
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
        shutil.rmtree(self.directory, ignore_errors=True)


def _store_kwargs(cfg: Config, manifest: Manifest, device: torch.device) -> dict:
    """Store settings: the serving config's, with the init settings the trainer used (from the manifest)."""
    s = cfg.serving
    kw = dict(device=device, hot_capacity_rows=int(s.hot_rows), init_scale=float(cfg.store.init_scale),
              block_cache_mb=int(cfg.store.block_cache_mb))
    if "init_scale" in (manifest.store_config or {}):  # decides the initial vector of unseen ids
        kw["init_scale"] = float(manifest.store_config["init_scale"])
    return kw


def _new_store(model_cfg: ModelConfig, cfg: Config, manifest: Manifest, device: torch.device, path: Path):
    from embedding_store import EmbeddingStore

    tables = {f.name: model_cfg.embedding_dim for f in model_cfg.fields}
    return EmbeddingStore(str(path), tables, shards=cfg.store.shards, seed=model_cfg.seed,
                          **_store_kwargs(cfg, manifest, device))


def _store_from_parent(parent: "ServedVersion", cfg: Config, manifest: Manifest, device: torch.device, path: Path):
    """A RocksDB checkpoint of the parent's store (hard links), opened as this version's own store."""
    from embedding_store import EmbeddingStore

    with parent._store_lock:
        parent.store.checkpoint(str(path))
    return EmbeddingStore.restore(str(path), **_store_kwargs(cfg, manifest, device))


def load_version(staged: Path, manifest: Manifest, parent: ServedVersion | None, versions_root: Path,
                 cfg: Config, device: torch.device) -> ServedVersion:
    """Build a served version from a verified snapshot directory (and its parent for a delta)."""
    model_cfg = model_config_from_dict(manifest.model_config)
    if manifest.kind == "delta":
        if parent is None or parent.version != manifest.parent_version:
            have = "none" if parent is None else parent.version
            raise LoadError("FAILED_PRECONDITION",
                            f"delta {manifest.version} needs parent {manifest.parent_version}, serving {have}; send a full snapshot")
        if parent.model_cfg != model_cfg:
            raise LoadError("FAILED_PRECONDITION", "delta's model_config differs from its parent's; send a full snapshot")
    vdir = versions_root / f"v{manifest.version:012d}"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    store = None
    try:
        state = read_dense(staged)
        if manifest.kind == "delta":
            merged = dict(parent.dense_state)
            merged.update(state)
            state = merged
        model = DLRM.from_config(model_cfg)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise LoadError("INVALID_ARGUMENT", f"dense.safetensors does not fit the model: {str(e)[:300]}") from None
        model.to(device).eval()
        if manifest.kind == "delta":
            store = _store_from_parent(parent, cfg, manifest, device, vdir / "store")
            rows_held = parent.rows_held  # + delta rows below: an upper bound (a changed row may already exist)
        else:
            store = _new_store(model_cfg, cfg, manifest, device, vdir / "store")
            rows_held = 0
        hot: dict[str, list] = {}
        hot_left = int(cfg.serving.hot_rows) if manifest.kind == "full" else 0
        tables = set(model_cfg.field_names)
        dim = model_cfg.embedding_dim
        for table, ids, vectors in iter_rows(staged, manifest):
            if table not in tables:
                raise LoadError("INVALID_ARGUMENT", f"rows: table {table!r} is not a model field")
            if vectors.shape[1] != dim:
                raise LoadError("INVALID_ARGUMENT", f"rows: table {table!r} has width {vectors.shape[1]}, model has {dim}")
            store.upsert_rows(table, ids, np.ascontiguousarray(vectors))
            rows_held += len(ids)
            if hot_left > 0:
                hot.setdefault(table, []).append(ids[:hot_left])
                hot_left -= min(hot_left, len(ids))
        if hot:  # a full snapshot: its first rows go to memory; a delta keeps its parent's hot set
            store.set_hot({t: np.concatenate(v) for t, v in hot.items()})
        return ServedVersion(manifest, model, store, model_cfg, {k: v.detach().clone() for k, v in state.items()},
                             vdir, rows_held, device)
    except BaseException as e:
        if store is not None:
            try:
                store.close()
            except Exception:
                pass
        shutil.rmtree(vdir, ignore_errors=True)
        if isinstance(e, SnapshotError):
            raise LoadError("DATA_LOSS", str(e)) from None
        from embedding_store import StoreError

        if isinstance(e, StoreError):
            raise LoadError("INVALID_ARGUMENT", f"rows: {e}") from None
        raise
