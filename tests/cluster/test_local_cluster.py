"""A cluster node's kill returns once the process is gone and its ports can be bound again,
so a restart right after gets the same ports (devtools/broker.py)."""

from __future__ import annotations

import os
import socket

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]


def bindable(port: int) -> bool:
    """Whether a new broker could listen on the port now (Kafka sets SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_killed_node_is_gone_with_its_ports_when_kill_returns(cluster):
    nodes = cluster.kafka.cluster
    ports = next(n for n in nodes.layout().nodes if n.node_id == 3)
    listening = [ports.port, ports.controller_port, *(lane[0] for lane in ports.lanes.values())]
    running = nodes.node(3).status()
    assert running is not None

    assert nodes.node(3).kill()
    with pytest.raises(ProcessLookupError):  # reaped: not a zombie whose threads still exit
        os.kill(running.pid, 0)
    assert [port for port in listening if not bindable(port)] == []
    assert nodes.node(3).start(timeout=90).port == ports.port  # at once, on the same ports
