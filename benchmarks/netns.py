"""A simulated cluster on one machine: H hosts as Linux network namespaces joined by shaped links.

Each host is a namespace ``<prefix>-h<i>`` with one interface ``eth0`` at ``10.<net>.0.<i+1>/24`` (addresses
that exist only inside these namespaces) and its own loopback. A switch namespace ``<prefix>-sw`` holds a
bridge; every host's link is a veth pair from its ``eth0`` to the bridge. A link is shaped in both directions
with a token bucket (``tc qdisc tbf``: bandwidth, and the queue it may build); latency and loss need the
``netem`` qdisc, which a kernel may not have (:func:`netem_available` says; :meth:`SimulatedCluster.shape`
refuses a latency it cannot apply rather than ignore it). ``cut(host)`` takes a host's link down (packets
vanish, no reset: what a pulled cable looks like to its peers) and ``heal(host)`` brings it back.

Processes run in a host with :meth:`SimulatedCluster.spawn` (``ip netns exec``), each with its own log file
under the cluster's directory, and are killed with the host (:meth:`kill_host`: SIGKILL to every process the
host started, at once). :meth:`close` kills every process and deletes every namespace and link the cluster
made, and the cluster is a context manager, so a test that fails still leaves nothing behind. Needs root (or
``CAP_NET_ADMIN``) and the ``ip`` and ``tc`` tools; :func:`available` says whether this machine has them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[:300]}")
    return p


def available() -> str:
    """'' when namespaces, veth pairs and tbf work here; else why not (one line)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the ip and tc tools (iproute2) are not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"srprobe{uuid.uuid4().hex[:6]}"
    p = _run("ip", "netns", "add", name, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()[:200]}"
    try:
        p = _run("ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1", check=False)
        if p.returncode != 0:
            return f"cannot create a veth pair: {p.stderr.strip()[:200]}"
        p = _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "100mbit",
                 "burst", "64kb", "latency", "50ms", check=False)
        if p.returncode != 0:
            return f"the tbf qdisc is missing: {p.stderr.strip()[:200]}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return ""


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (link latency and loss)."""
    name = f"srprobe{uuid.uuid4().hex[:6]}"
    if _run("ip", "netns", "add", name, check=False).returncode != 0:
        return False
    try:
        _run("ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1", check=False)
        return _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "v0", "root", "netem", "delay", "1ms",
                    check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", name, check=False)


@dataclass
class Host:
    index: int
    ns: str
    address: str
    veth_host: str = "eth0"
    veth_switch: str = ""
    procs: list = field(default_factory=list)


class SimulatedCluster:
    """``hosts`` namespaces on one bridge, every link at ``mbit`` Mbit/s each way (0: unshaped)."""

    def __init__(self, hosts: int, root: Path, mbit: float = 0.0, net: int = 77, prefix: str | None = None):
        if not 1 <= hosts <= 32:
            raise ValueError(f"hosts must be in 1..32, got {hosts}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix or f"sr{uuid.uuid4().hex[:5]}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [Host(i, f"{self.prefix}-h{i}", f"10.{net}.0.{i + 1}", veth_switch=f"{self.prefix}p{i}")
                      for i in range(hosts)]
        self._made: list[str] = []
        self.mbit = 0.0
        try:
            self._build()
            if mbit:
                self.shape(mbit)
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            _run("ip", "netns", "add", h.ns)
            self._made.append(h.ns)
            # created inside the switch namespace, one end moved to the host: nothing appears in the root namespace
            _run("ip", "-n", self.switch, "link", "add", h.veth_switch, "type", "veth", "peer", "name", "eth0",
                 "netns", h.ns)
            _run("ip", "-n", self.switch, "link", "set", h.veth_switch, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", h.veth_switch, "up")
            _run("ip", "-n", h.ns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _run("ip", "-n", h.ns, "link", "set", "eth0", "up")
            _run("ip", "-n", h.ns, "link", "set", "lo", "up")

    # -- links ---------------------------------------------------------------------------------
    def shape(self, mbit: float, latency_ms: float = 0.0, loss: float = 0.0) -> None:
        """Every link at ``mbit`` Mbit/s each way (0: unshaped). Latency and loss need netem."""
        if latency_ms or loss:
            if not netem_available():
                raise RuntimeError("this kernel has no netem qdisc: link latency and loss cannot be simulated here")
        for h in self.hosts:
            for ns, dev in ((h.ns, "eth0"), (self.switch, h.veth_switch)):
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if mbit:
                    burst = max(32 * 1024, int(mbit * 1e6 / 8 / 250))  # 4 ms of the rate, at least 32 KiB
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                         f"{mbit}mbit", "burst", str(burst), "latency", "100ms")
        self.mbit = float(mbit)

    def cut(self, host: int) -> None:
        """Take host ``host``'s link down on the switch side: its packets vanish, nobody gets a reset."""
        _run("ip", "-n", self.switch, "link", "set", self.hosts[host].veth_switch, "down")

    def heal(self, host: int) -> None:
        _run("ip", "-n", self.switch, "link", "set", self.hosts[host].veth_switch, "up")

    # -- processes -----------------------------------------------------------------------------
    def spawn(self, host: int, cmd: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        """Start ``cmd`` in host ``host``; its output goes to ``<root>/h<host>-<name>.log``."""
        h = self.hosts[host]
        log = open(self.root / f"h{host}-{name}.log", "ab")
        p = subprocess.Popen(["ip", "netns", "exec", h.ns, *cmd], stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, **(env or {})}, start_new_session=True)
        log.close()
        h.procs.append(p)
        return p

    def kill_host(self, host: int) -> None:
        """SIGKILL every process host ``host`` started (their process groups), at once."""
        self.kill(self.hosts[host].procs)

    @staticmethod
    def kill(procs: list[subprocess.Popen]) -> None:
        """SIGKILL the process groups of ``procs`` (started by :meth:`spawn`), at once, and reap them."""
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Kill every process, delete every namespace (their links go with them)."""
        for h in self.hosts:
            self.kill_host(h.index)
        for ns in self._made:  # anything still inside (a process that left its process group)
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in reversed(self._made):
            _run("ip", "netns", "del", ns, check=False)
        self._made = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                ns in _run("ip", "netns", "list", check=False).stdout for ns in (h.ns for h in self.hosts)):
            time.sleep(0.1)

    def __enter__(self) -> "SimulatedCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
