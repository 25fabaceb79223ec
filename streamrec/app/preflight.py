"""Checks a process makes before it starts work, so that what a user can fix is one line.

A data directory that cannot be created or written, a port another process holds:
found deep inside RocksDB, faust or gRPC these surface late and as tracebacks (or,
for the embedded broker, as silence). Checked here first, they become a
:class:`SetupError` that names the thing, the config key and what to do.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from pathlib import Path

from streamrec.foundation import StreamrecError
from streamrec.app.config import Config

# the config keys that name a directory (or a file inside one) a process writes
DATA_PATHS = {
    "store.path": ("store", "path"),
    "sketch.state_dir": ("sketch", "state_dir"),
    "trainer.checkpoint_dir": ("trainer", "checkpoint_dir"),
    "trainer.snapshot_dir": ("trainer", "snapshot_dir"),
    "serving.data_dir": ("serving", "data_dir"),
}
DEFAULT_PREFIX = "data/"  # the defaults are data/store, data/sketch, ...: --data-dir DIR makes them DIR/store, ...


class SetupError(StreamrecError, RuntimeError):
    """Something outside streamrec's data is in the way: a directory, a port. The message says what to do."""


def apply_data_dir(cfg: Config, data_dir: str) -> Config:
    """Root every relative data path under ``data_dir`` (``data/store`` -> ``DIR/store``) and, when no
    metrics log is configured, write it to ``DIR/metrics.jsonl`` (what ``streamrec report DIR`` reads)."""
    root = Path(data_dir).expanduser().resolve()
    for section, key in DATA_PATHS.values():
        value = getattr(getattr(cfg, section), key)
        if value and not os.path.isabs(value):
            rel = value[len(DEFAULT_PREFIX):] if value.startswith(DEFAULT_PREFIX) else value
            setattr(getattr(cfg, section), key, str(root / rel))
    if not cfg.trainer.log_path:
        cfg.trainer.log_path = str(root / "metrics.jsonl")
    elif not os.path.isabs(cfg.trainer.log_path):
        cfg.trainer.log_path = str(root / cfg.trainer.log_path)
    return cfg


def ensure_dirs(cfg: Config, *keys: str) -> None:
    """Create the directories of ``keys`` (parents too) and check this user can write there."""
    for key in keys:
        if key == "trainer.log_path":
            path = os.path.dirname(os.path.abspath(cfg.trainer.log_path)) if cfg.trainer.log_path else ""
        else:
            section, name = DATA_PATHS[key]
            path = getattr(getattr(cfg, section), name)
        if path:
            ensure_writable_dir(path, key)


def ensure_writable_dir(path: str, key: str) -> None:
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as e:
        why = e.strerror or str(e)
        if isinstance(e, FileExistsError) or e.errno in (errno.ENOTDIR, errno.EEXIST):
            why = "a file is in the way (not a directory)"
        raise SetupError(f"data directory {p} ({key}) cannot be used: {why}; give this user write access there, "
                         f"or point --data-dir (or {key}) at a writable directory") from None


def ensure_port_free(host: str, port: int, what: str, key: str) -> None:
    """Refuse early when ``host:port`` is taken (0 means any free port and always passes)."""
    if not port:
        return
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # as servers do: a port left in TIME_WAIT by a process that just stopped is free, a listening one is not
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise SetupError(f"port {port} on {host} ({what}) is already in use by another process: stop it "
                             f"(`ss -ltnp 'sport = :{port}'` names it) or choose another port ({key})") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise SetupError(f"{host} ({what}) is not an address of this machine: set {key} to one that is "
                             "(127.0.0.1, or 0.0.0.0 for every interface)") from None
        if e.errno == errno.EACCES:
            raise SetupError(f"port {port} ({what}) needs privileges this user does not have: use a port above "
                             f"1023 ({key})") from None
        raise
    finally:
        s.close()
