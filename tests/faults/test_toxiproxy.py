"""The Toxiproxy client against the real server, in front of a small TCP echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from enhydra.devtools.ports import free_port
from enhydra.devtools.toxiproxy import ToxiproxyServer
from enhydra.testing.toxiproxy import Toxiproxy, ToxiproxyApiError

pytestmark = pytest.mark.integration


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(1024):
                conn.sendall(data)
        except OSError:
            pass


def roundtrip(port: int, timeout: float = 2.0) -> float:
    """Seconds for one echo through the proxy; raises on a silent or reset connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(b"ping")
        if sock.recv(16) != b"ping":
            raise ConnectionError("no echo")
        return time.monotonic() - started


def test_toxics_slow_silence_and_reset_a_connection_until_removed(tmp_path, echo):
    server = ToxiproxyServer(tmp_path / "toxiproxy.log").start()
    try:
        api = Toxiproxy(server.api_url)
        listen = free_port()
        proxy = api.create("echo", f"127.0.0.1:{listen}", f"127.0.0.1:{echo}")
        assert roundtrip(listen) < 0.2

        proxy.latency(300)
        assert roundtrip(listen) >= 0.3
        proxy.clear()

        proxy.timeout(0)
        with pytest.raises(TimeoutError):
            roundtrip(listen, timeout=0.5)
        api.reset()
        assert roundtrip(listen) < 0.2

        proxy.reset_peer()
        with pytest.raises((ConnectionError, OSError)):
            roundtrip(listen)
        proxy.clear()

        proxy.set_enabled(False)
        with pytest.raises(ConnectionRefusedError):
            roundtrip(listen)
        proxy.set_enabled(True)
        assert roundtrip(listen) < 0.2

        with pytest.raises(ToxiproxyApiError, match="409"):
            api.create("echo", f"127.0.0.1:{listen}", f"127.0.0.1:{echo}")
    finally:
        server.stop()
