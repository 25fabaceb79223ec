"""``free_port``: ports below the kernel's ephemeral range (where no outgoing connection or bind to port 0 can
take them before the server binds), never the same one twice in a process, never one something holds."""

from __future__ import annotations

import random
import socket

from streamrec.ingest import broker, free_port


def test_ports_lie_below_the_ephemeral_range_are_distinct_and_bindable():
    low = broker._ephemeral_low()  # noqa: SLF001 - the module's own reading of the kernel's range
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)
    assert all(broker.PORTS_FROM <= p < low for p in ports), (min(ports), max(ports), low)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_something_holds_is_skipped(monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    choices = iter([taken, taken, broker.PORTS_FROM + 7])

    class Picks:
        def randrange(self, a, b):
            return next(choices)

    monkeypatch.setattr(broker, "_ephemeral_low", lambda: broker.PORTS_FROM + 5000)
    monkeypatch.setattr(random, "SystemRandom", Picks)
    monkeypatch.setattr(broker, "_handed_out", set())
    try:
        assert free_port() == broker.PORTS_FROM + 7
    finally:
        held.close()


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(broker, "_ephemeral_low", lambda: broker.PORTS_FROM + 10)
    port = free_port()
    assert not broker.PORTS_FROM <= port < broker.PORTS_FROM + 10
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
