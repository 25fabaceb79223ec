"""A serving group: ``serving.processes`` server processes answering on one port.

Why: one server process runs on about one core (its Python holds the GIL: BENCHMARKS.md, serve), so a
machine with more cores needs more processes to use them. Each process is a whole ``ServingServer``
with its own copy of the model (``serving.data_dir/proc-<i>/``: its versions and RocksDB store), bound to
the same ``serving.host:port`` with SO_REUSEPORT (Linux): the kernel hands each new connection to one of
them. Clients see one endpoint; a client's connection stays with one process, so spreading load needs
several connections (several clients, or a client-side pool), as with any load balancer.

Pushes reach every process: the process a push lands on forwards it to the others over their own loopback
ports (``siblings.py``). The supervisor (this module, in the ``streamrec serve`` process) starts the
processes, writes ``group.json`` (index -> loopback port), restarts a process that dies (backoff 1 s
doubling to 30 s; a restarted process serves the version it last held until the next push reaches it), and
stops them all on shutdown (SIGTERM, then SIGKILL after the grace period). A process whose supervisor
died stops by itself. Memory is N copies of the served model and its hot rows.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from streamrec.foundation import ConfigError, StreamrecError
from streamrec.app.config import Config

from .siblings import GROUP_FILE, write_group_file

log = logging.getLogger("streamrec.serving")

START_TIMEOUT_S = 180.0  # a process that has not said it is listening by then is a failed start
RESTART_BACKOFF_S = (1.0, 30.0)  # first and longest wait before restarting a process that died
STABLE_AFTER_S = 60.0  # a process that lived this long resets its restart backoff


def process_config(cfg: Config, index: int) -> Config:
    """Process ``index``'s config: its own directory and metrics port, torch threads shared out."""
    c = copy.deepcopy(cfg)
    s = c.serving
    s.data_dir = str(Path(cfg.serving.data_dir) / f"proc-{index}")
    s.metrics_port = cfg.serving.metrics_port + index if cfg.serving.metrics_port else 0
    if not s.torch_threads:  # torch's default is every core in each process: share them out instead
        s.torch_threads = max(1, (os.cpu_count() or 1) // cfg.serving.processes)
    return c


class GroupStartError(StreamrecError, RuntimeError):
    """A process of the group did not start; the message says which and why (the CLI prints it as one line)."""


class _ProcessTag(logging.Filter):
    """Names the group's process in each log record (``serve[1].streamrec.serving``)."""

    def __init__(self, index: int):
        super().__init__()
        self.prefix = f"serve[{index}]."

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = self.prefix + record.name
        return True


def _process_main(cfg: Config, index: int, port: int, device, insecure_push: bool, key: str, snapshot,
                  conn, log_level: int, formatter: logging.Formatter | None, parent_pid: int) -> None:
    """One process of the group (spawned): serve until SIGTERM or until the supervisor is gone."""
    import torch

    from .server import ServingServer
    from .siblings import Siblings

    handler = logging.StreamHandler(sys.stderr)  # as the supervisor logs (text or JSON), naming the process
    handler.setFormatter(formatter or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_ProcessTag(index))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(log_level)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor too; it stops us in order
    pcfg = process_config(cfg, index)
    try:
        torch.set_num_threads(pcfg.serving.torch_threads)
        siblings = Siblings(Path(cfg.serving.data_dir), index, key, push_token=cfg.serving.push_token,
                            max_message_mb=cfg.serving.max_message_mb)
        server = ServingServer(pcfg, device, port, insecure_push=insecure_push, siblings=siblings)
        if snapshot and (why := server.service.install_from(snapshot)) is not None:
            log.warning("--snapshot not loaded: %s", why)
        server.start()
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        conn.close()
        sys.exit(1)
    conn.send(("ready", server.port, server.private_port))
    conn.close()
    while not stop.wait(0.5):
        if os.getppid() != parent_pid:  # the supervisor died (kill -9): nobody would stop or restart us
            log.warning("the serving supervisor (pid %d) is gone; stopping", parent_pid)
            break
    server.stop(2.0)


def _reserve_port(host: str) -> socket.socket | None:
    """A free port of ``host``, held by a socket bound with SO_REUSEPORT but not listening (so it takes no
    connections) while the group's processes bind the same port; None if that fails (the first process
    then picks the port and the others start after it)."""
    h = host.strip("[]")
    s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((h, 0))
    except OSError as e:
        log.info("could not reserve a free port on %s (%s): starting the first serving process alone", host, e)
        s.close()
        return None
    return s


def _formatter() -> logging.Formatter | None:
    """The supervisor's log format, for its processes (None: the default text one, also when the format cannot
    travel to a spawned process, e.g. a test runner's that holds its terminal)."""
    import pickle

    f = next((h.formatter for h in logging.getLogger().handlers if h.formatter is not None), None)
    try:
        pickle.dumps(f)
    except Exception:
        return None
    return f


class ServingGroup:
    """``serving.processes`` server processes on one port (see the module docstring): ``.target``, ``.port``,
    ``.processes`` (index -> pid), ``.stop()``."""

    def __init__(self, cfg: Config, device=None, port: int | None = None, insecure_push: bool = False,
                 snapshot: str | None = None):
        from .server import startup_warnings

        if not sys.platform.startswith("linux"):
            raise ConfigError(f"serving.processes = {cfg.serving.processes} needs Linux (SO_REUSEPORT spreads "
                              "connections there); run one process per port elsewhere")
        self.cfg = cfg
        self.warnings = startup_warnings(cfg, insecure_push)  # raises before any process starts
        self.device = str(device or cfg.trainer.device)
        self._want_port = cfg.serving.port if port is None else port
        self.insecure_push = insecure_push
        self.snapshot = snapshot
        self.key = secrets.token_hex(16)  # forwarded pushes carry it (siblings.py); never written to disk
        self.root = Path(cfg.serving.data_dir)
        self.host = cfg.serving.host
        self.tls = bool(cfg.serving.tls_cert)
        self.port = 0
        self.restarts = 0
        self._ctx = mp.get_context("spawn")  # no fork: the supervisor may hold threads and gRPC state
        self._procs: dict[int, mp.Process] = {}
        self._ports: dict[int, int] = {}
        self._started_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def processes(self) -> dict[int, int]:
        """Index -> pid of each process alive now."""
        with self._lock:
            return {i: p.pid for i, p in self._procs.items() if p.is_alive()}

    def _spawn(self, index: int, port: int, snapshot: str | None) -> tuple[mp.Process, object]:
        parent, child = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=_process_main, name=f"streamrec-serve-{index}",
                              args=(self.cfg, index, port, self.device, self.insecure_push, self.key, snapshot,
                                    child, logging.getLogger().getEffectiveLevel(), _formatter(), os.getpid()))
        p.start()
        child.close()
        return p, parent

    def _await_ready(self, index: int, p: mp.Process, conn) -> tuple[int, int]:
        """(public port, loopback port) once process ``index`` listens; raises if it failed or took too long."""
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if conn.poll(0.2):
                    msg = conn.recv()
                    if msg[0] == "ready":
                        return int(msg[1]), int(msg[2])
                    raise GroupStartError(f"serving process {index} failed to start: {msg[1]}")
                if not p.is_alive():
                    raise GroupStartError(f"serving process {index} exited with code {p.exitcode} while starting")
        except EOFError:
            raise GroupStartError(f"serving process {index} exited with code {p.exitcode} while starting") from None
        finally:
            conn.close()
        p.kill()
        raise GroupStartError(f"serving process {index} did not start within {START_TIMEOUT_S:.0f} s")

    def _launch(self, index: int, port: int, snapshot: str | None = None) -> int:
        """Start process ``index`` on ``port`` (loading ``snapshot`` first, the first start's ``--snapshot``: a
        restarted process serves the newest version its own directory holds) and wait until it listens."""
        p, conn = self._spawn(index, port, snapshot)
        with self._lock:
            self._procs[index] = p
        public, private = self._await_ready(index, p, conn)
        with self._lock:
            self._ports[index] = private
            self._started_at[index] = time.monotonic()
            write_group_file(self.root, self._ports)
        log.info("serving process %d (pid %d) on %s:%d, forwarded pushes on 127.0.0.1:%d", index, p.pid,
                 self.host, public, private)
        return public

    def start(self) -> "ServingGroup":
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / GROUP_FILE).unlink(missing_ok=True)  # a previous run's ports are stale
        reserved = None if self._want_port else _reserve_port(self.host)
        try:
            if reserved is None and not self._want_port:  # the first process picks a free port, the others join it
                self.port = self._launch(0, 0, self.snapshot)
                first = 1
            else:  # a known port (configured, or held for us by `reserved`): every process starts at once
                self.port = self._want_port or reserved.getsockname()[1]
                first = 0
            errors: list[BaseException] = []

            def launch(i: int) -> None:
                try:
                    self._launch(i, self.port, self.snapshot)
                except BaseException as e:  # reported below, after every launch has finished
                    errors.append(e)

            threads = [threading.Thread(target=launch, args=(i,), daemon=True)
                       for i in range(first, self.cfg.serving.processes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
        except BaseException:
            self.stop(0.5)
            raise
        finally:
            if reserved is not None:
                reserved.close()
        self._monitor = threading.Thread(target=self._watch, name="serving-group", daemon=True)
        self._monitor.start()
        for w in self.warnings:
            log.warning("%s", w)
        log.info("serving group: %d processes on %s", self.cfg.serving.processes, self.target)
        return self

    def _watch(self) -> None:
        """Restart a process that died, after its backoff."""
        while not self._stopping.wait(0.5):
            with self._lock:
                dead = [i for i, p in self._procs.items() if not p.is_alive()]
            for i in dead:
                code = self._procs[i].exitcode
                lived = time.monotonic() - self._started_at.get(i, time.monotonic())
                wait = RESTART_BACKOFF_S[0] if lived >= STABLE_AFTER_S else self._backoff.get(i, RESTART_BACKOFF_S[0])
                self._backoff[i] = min(RESTART_BACKOFF_S[1], wait * 2)
                log.error("serving process %d exited with code %s after %.0f s; restarting it in %.0f s", i, code,
                          lived, wait)
                if self._stopping.wait(wait):
                    return
                try:
                    self._launch(i, self.port)
                    self.restarts += 1
                except Exception as e:  # tried again on the next round, after a longer wait
                    log.error("%s", e)
                    with self._lock:
                        self._started_at[i] = time.monotonic()

    def stop(self, grace: float = 2.0) -> None:
        """Stop every process: SIGTERM, and SIGKILL for any still alive ``grace`` + 5 s later."""
        self._stopping.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=grace + 10)
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace + 5
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("serving process %s (pid %d) did not stop; killing it", p.name, p.pid)
                p.kill()
                p.join(5)

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopping.wait(timeout)

    def __enter__(self) -> "ServingGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(0.5)
