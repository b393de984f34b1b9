"""Test servers get ports no outgoing connection can take (devtools/ports.py): a port chosen
from the ephemeral range was once taken by a Kafka client between choosing and binding it, and
an instance exited at start with "web port in use"."""

from __future__ import annotations

import socket

import pytest

from enhydra.devtools import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    start = ports._ephemeral_start()
    chosen = [ports.free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    assert all(ports.LOWEST <= port < start for port in chosen)


def test_each_xdist_worker_scans_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        low, high = ports._slice()
        slices.append(range(low, high))
        assert low <= ports.free_port() < high
    assert all(not set(a) & set(b) for a in slices for b in slices if a is not b)
    assert slices[0].start == ports.LOWEST and slices[-1].stop <= ports._ephemeral_start()


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_slice", lambda: (port, port + 1))
        monkeypatch.setattr(ports, "_handed_out", set())
        assert not ports.port_free(port)
        with pytest.raises(OSError, match=f"between {port} and {port + 1}"):
            ports.free_port()
    assert ports.free_port() == port  # released: free again
