"""Free TCP ports on 127.0.0.1 for local brokers, databases, proxies and service instances.

Binding port 0 hands out a port from the kernel's ephemeral range, the range every outgoing
connection's local port also comes from. Between choosing such a port and a server binding it,
a Kafka client of another test may connect *from* it, and the server then exits with "address
in use" (seen in CI). The ports here come from outside that range, so no outgoing connection
takes them, and each is reserved with a file for a while, so no other process (another test
worker, a subprocess, a second test session) is handed it before its server has bound it.
Reservations live in $ENHYDRA_PORTS_DIR, else <tmp>/enhydra-ports.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import tempfile
import time
from pathlib import Path

from enhydra.toolcache import file_lock

HOST = "127.0.0.1"
LOWEST = 10000  # below: ports that well-known servers use
RESERVED_S = 600.0  # a server binds its port within seconds; a reservation outlives that
_MIN_SPAN = 1000
_DEFAULT_EPHEMERAL = (32768, 60999)


def reservations() -> Path:
    """Where reservations live: one file per port handed out (its owner), for all processes."""
    configured = os.environ.get("ENHYDRA_PORTS_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "enhydra-ports"


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a server could bind the port now (with SO_REUSEADDR, as Kafka and aiohttp do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(exclude: set[int] | None = None, owner: str = "") -> int:
    """A port free now, outside the ephemeral range, reserved for `owner` (see `claim`)."""
    low, high = port_range()
    start = random.randrange(low, high)
    for step in range(high - low):
        port = low + (start - low + step) % (high - low)
        if port not in (exclude or ()) and claim(port, owner):
            return port
    raise OSError(
        f"no free TCP port on {HOST} between {low} and {high}; "
        f"hint: stop old test servers, or empty {reservations()}"
    )


def claim(port: int, owner: str = "") -> bool:
    """Reserve `port` for `owner` when it lies outside the ephemeral range, is free, and is not
    reserved by another owner in the last RESERVED_S seconds. A server started again (a broker
    on the data folder it used before) takes its port back with the same `owner`."""
    low, high = port_range()
    if not low <= port < high:
        return False
    folder = reservations()
    path = folder / str(port)
    with file_lock(folder / ".lock"):  # one claim at a time, across processes and threads
        try:
            fresh = time.time() - path.stat().st_mtime < RESERVED_S
            held_by = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            fresh, held_by = False, ""
        if fresh and not (owner and held_by == owner):
            return False
        if not port_free(port):
            return False
        path.write_text(owner, encoding="utf-8")
    return True


def port_range() -> tuple[int, int]:
    """[low, high): the ports outside the kernel's ephemeral range: below it, else above it."""
    start, end = _ephemeral_range()
    if start - LOWEST >= _MIN_SPAN:
        return LOWEST, start
    if 65535 - end >= _MIN_SPAN:
        return end + 1, 65536
    raise OSError(
        f"the ephemeral port range {start}-{end} leaves no room for test servers; hint: narrow "
        "net.ipv4.ip_local_port_range (sysctl), e.g. to 32768 60999"
    )


@functools.cache  # read once: every port tried checks the range
def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            start, end = (int(n) for n in ranges.read().split()[:2])
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return start, end
