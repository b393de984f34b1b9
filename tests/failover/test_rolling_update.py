"""A Deployment's rolling update on the real broker: the old pod stops, a new pod (new name,
empty volume) starts 2 s later and must serve every key without ever exiting.

The old pod is a static member (KIP-345). Stopped without leaving, the group awaits it until its
session times out and holds the new pod's join meanwhile: the new pod must wait, not ready, and
not take the held join for a broker that does not answer. A pod a ReplicaSet named leaves the
group on stop (its name never comes back), so the new pod does not wait at all.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from enhydra.testing.processes import ServiceProcess, free_port
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

TARGET = "ledger.service:service"
PRODUCTION_DEFAULTS = (  # the test environment's short group timeouts, removed
    "ENHYDRA_SESSION_TIMEOUT_MS",
    "ENHYDRA_HEARTBEAT_INTERVAL_MS",
    "ENHYDRA_REBALANCE_TIMEOUT_MS",
)


def pod(
    service_factory: Any, name: str, tmp_path: Path, unset: tuple[str, ...] = (), **env: str
) -> ServiceProcess:
    """An instance with its own empty volume and the production group timeouts (30 s session
    and rebalance, 500 ms heartbeat); the test environment's `unset` variables take their
    defaults too."""
    proc = service_factory(
        TARGET,
        name,
        state_dir=tmp_path / f"volume-{name}",
        web_port=free_port(),
        extra_env=env,
        start=False,
    )
    for variable in (*PRODUCTION_DEFAULTS, *unset):
        proc.env.pop(variable, None)
    return proc.start()


def roll(
    old: ServiceProcess, new_pod: Any, timeout: float = 90.0
) -> tuple[ServiceProcess, float, set[int | None]]:
    """SIGTERM the old pod, start the new one 2 s later: the new pod, the seconds until it is
    ready, and the /health/ready answers it gave meanwhile (None: not listening yet).

    The new pod must never exit.
    """
    answers: set[int | None] = set()
    assert old.process is not None
    old.process.send_signal(signal.SIGTERM)
    time.sleep(2)
    new = new_pod()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        assert new.alive(), f"the new pod exited:\n{new.log_tail(30)}"
        try:
            status, _ = new.get("/health/ready")
        except OSError:
            status = None
        answers.add(status)
        if status == 200:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"not ready after {timeout} s:\n{new.log_tail(30)}")
    assert old.process.wait(30) == 0
    return new, time.monotonic() - started, answers


def test_a_new_pod_waits_out_a_held_join_and_serves_every_key(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    old = pod(service_factory, "a", tmp_path, ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN="false")
    old.wait_ready()
    commands = generate(60, 1500, seed=83)
    feed(kafka_bootstrap, app_id, commands[:1000])

    new, took, answers = roll(old, lambda: pod(service_factory, "b", tmp_path))
    print(f"new pod ready {took:.1f} s after its start (held join)")
    assert took > 15, "the join was held until the old member's session timed out"
    assert 503 in answers  # waiting, and saying so
    assert "the group holds this join" in new.log_tail(400)
    feed(kafka_bootstrap, app_id, commands[1000:])
    expected = model(commands)
    assert read_accounts([new], sorted(expected)) == expected
    assert new.alive()


def test_a_deployments_pod_leaves_the_group_on_stop_so_the_next_pod_joins_at_once(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    def deployment_pod(name: str) -> ServiceProcess:
        kubernetes = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": name}
        leave = ("ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN",)  # the default: auto
        return pod(service_factory, name, tmp_path, unset=leave, **kubernetes)

    old = deployment_pod("ledger-7d9f8b6c5d-x2k4q")
    old.wait_ready()
    commands = generate(60, 1500, seed=89)
    feed(kafka_bootstrap, app_id, commands[:1000])

    new, took, _ = roll(old, lambda: deployment_pod("ledger-7d9f8b6c5d-b8mzt"))
    print(f"new pod ready {took:.1f} s after its start (the old pod left)")
    assert "left the group" in old.log_tail(200)
    assert took < 15
    feed(kafka_bootstrap, app_id, commands[1000:])
    expected = model(commands)
    assert read_accounts([new], sorted(expected)) == expected
