"""Test servers get ports no outgoing connection can take and no other process is handed
(devtools/ports.py): a port chosen from the ephemeral range was once taken by a Kafka client
between choosing and binding it, and an instance exited at start with "web port in use"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from enhydra.devtools import ports


@pytest.fixture(autouse=True)
def own_reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "ports"
    monkeypatch.setenv("ENHYDRA_PORTS_DIR", str(folder))
    return folder


def ephemeral() -> tuple[int, int]:
    start, end = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(start), int(end)


def test_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    start, end = ephemeral()
    chosen = [ports.free_port() for _ in range(100)]
    assert len(set(chosen)) == len(chosen)
    assert not any(start <= port <= end for port in chosen)


def test_another_process_is_not_handed_a_reserved_port(own_reservations: Path) -> None:
    mine = {ports.free_port() for _ in range(50)}
    code = (
        "from enhydra.devtools import ports\n"
        "print(' '.join(str(ports.free_port()) for _ in range(50)))\n"
        "print(int(ports.claim(int(__import__('sys').argv[1]))))\n"
    )
    one = min(mine)
    out = subprocess.run(
        [sys.executable, "-c", code, str(one)],
        env={**os.environ, "ENHYDRA_PORTS_DIR": str(own_reservations)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    theirs = {int(p) for p in out[0].split()}
    assert not mine & theirs
    assert out[1] == "0"  # asked for by name, a port reserved by another: refused


def test_an_owner_takes_its_port_back_and_an_old_reservation_expires(
    own_reservations: Path,
) -> None:
    port = ports.free_port(owner="/data/broker-a")
    assert ports.claim(port, owner="/data/broker-a")  # the same broker started again
    assert not ports.claim(port, owner="/data/broker-b")
    assert not ports.claim(port)
    old = 2 * ports.RESERVED_S
    os.utime(own_reservations / str(port), (os.path.getmtime(own_reservations) - old,) * 2)
    assert ports.claim(port, owner="/data/broker-b")


def test_a_port_in_use_is_never_claimed_and_the_range_is_never_the_ephemeral_one() -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = ports.free_port()
        taken.bind(("127.0.0.1", port))
        taken.listen()
        os.remove(ports.reservations() / str(port))  # no reservation: only the bind refuses
        assert not ports.port_free(port)
        assert not ports.claim(port)
    low, high = ports.port_range()
    start, end = ephemeral()
    assert high <= start or low > end


def test_a_kernel_range_that_leaves_no_room_is_one_plain_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 65000))
    with pytest.raises(OSError, match="ip_local_port_range"):
        ports.free_port()
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 40000))
    assert ports.port_range() == (40001, 65536)
    assert 40001 <= ports.free_port() < 65536
