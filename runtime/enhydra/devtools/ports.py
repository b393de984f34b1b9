"""Free TCP ports on 127.0.0.1 for local brokers, databases, proxies and service instances.

Binding port 0 hands out a port from the kernel's ephemeral range, the range every outgoing
connection's local port also comes from. Between choosing such a port and a server binding it,
a Kafka client on another test worker may connect *from* it, and the server then exits with
"address in use" (seen in CI). The ports here come from below that range, so no outgoing
connection can take them, and each pytest-xdist worker scans its own slice of it.
"""

from __future__ import annotations

import os
import random
import socket
import threading

HOST = "127.0.0.1"
LOWEST = 10000
_DEFAULT_EPHEMERAL_START = 32768

_lock = threading.Lock()
_handed_out: set[int] = set()


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a server could bind the port now (with SO_REUSEADDR, as Kafka and aiohttp do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(exclude: set[int] | None = None) -> int:
    """A port free now, outside the ephemeral range, never handed out before by this process."""
    low, high = _slice()
    start = random.randrange(low, high)
    with _lock:
        for step in range(high - low):
            port = low + (start - low + step) % (high - low)
            if port in _handed_out or port in (exclude or ()):
                continue
            if port_free(port):
                _handed_out.add(port)
                return port
    raise OSError(
        f"no free TCP port on {HOST} between {low} and {high}; hint: stop old test servers"
    )


def _slice() -> tuple[int, int]:
    """This worker's share of [LOWEST, ephemeral start): its own, so workers never race."""
    high = _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return LOWEST, high
    width = (high - LOWEST) // max(int(count), 1)
    low = LOWEST + width * (int(worker[2:]) % max(int(count), 1))
    return low, low + width


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            start = int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_START
    return start if start > LOWEST + 1000 else _DEFAULT_EPHEMERAL_START
