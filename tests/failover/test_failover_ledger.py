"""Failover of the ledger at production settings, on the real broker, with commands flowing.

The instances run with the defaults a user gets (30 s session timeout, 500 ms heartbeat,
static membership, the failure detector), not the short test timeouts: detection must not
depend on the session timeout. Each test ends with the state equal to the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from enhydra.contracts.headers import COMMAND_ID_HEADER, EVENT_INDEX_HEADER, header
from enhydra.testing.processes import (
    ServiceProcess,
    free_port,
    produce_json,
    read_topic,
    wait_for_committed,
)
from ledger.workload import generate, model
from tests.failover.support import stalled_port, wait_until
from tests.integration.ledger_support import feed, read_accounts

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

TARGET = "ledger.service:service"
# The test environment's short group timeouts, removed so the production defaults apply.
TEST_TIMEOUTS = ("ENHYDRA_SESSION_TIMEOUT_MS", "ENHYDRA_HEARTBEAT_INTERVAL_MS")


def production(service_factory: Any, name: str, tmp_path: Path, **env: str) -> ServiceProcess:
    """An instance with the production defaults, its own volume and a fixed port."""
    proc = service_factory(
        TARGET,
        name,
        state_dir=tmp_path / f"state-{name}",
        web_port=free_port(),
        extra_env={"ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "false", **env},
        start=False,
    )
    for variable in TEST_TIMEOUTS:
        proc.env.pop(variable, None)
    proc.start()
    return proc


class Sender:
    """Commands at a steady rate from a thread, the way clients keep sending during a failure."""

    def __init__(self, bootstrap: str, topic: str, commands: list, rate: float) -> None:
        self.bootstrap, self.topic, self.commands, self.rate = bootstrap, topic, commands, rate
        self.sent = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        chunk = max(1, int(self.rate / 20))
        started = time.monotonic()
        while self.sent < len(self.commands):
            await produce_json(
                self.bootstrap, self.topic, self.commands[self.sent : self.sent + chunk]
            )
            self.sent += chunk
            await asyncio.sleep(max(0.0, started + self.sent / self.rate - time.monotonic()))

    def join(self) -> list:
        self.thread.join(timeout=300)
        return self.commands


def active(instance: ServiceProcess) -> set[int]:
    _, stats = instance.get("/v1/stats")
    return {int(p) for p, t in stats["tasks"].items() if t["role"] == "active"}


def gap_after(events: list, partitions: set[int], moment: float) -> float:
    """Seconds from `moment` (wall clock) to the first event of `partitions` produced after it."""
    after = [e.timestamp / 1000 for e in events if e.partition in partitions]
    after = [t for t in after if t > moment + 0.02]
    assert after, f"no event of partitions {sorted(partitions)} after the moment"
    return min(after) - moment


def assert_exactly_the_model(bootstrap: str, app_id: str, commands: list, readers: list) -> None:
    """The state equals the model, and every accepted command has its event (none lost)."""
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=180))
    expected = model(commands)
    assert read_accounts(readers, sorted(expected)) == expected
    events = asyncio.run(read_topic(bootstrap, f"{app_id}-events"))
    distinct = {
        (header(e.headers, COMMAND_ID_HEADER), header(e.headers, EVENT_INDEX_HEADER))
        for e in events
    }
    assert len(distinct) == sum(state["version"] for state in expected.values())


def test_kill_9_of_an_owner_moves_its_partitions_within_two_seconds(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    a = production(service_factory, "a", tmp_path, ENHYDRA_CLIENT_TAGS="zone=a")
    b = production(service_factory, "b", tmp_path, ENHYDRA_CLIENT_TAGS="zone=b")
    a.wait_ready()
    b.wait_ready()
    first = generate(400, 3000, seed=61)
    feed(kafka_bootstrap, app_id, first)
    wait_until(lambda: active(a) and active(b), 60, step=0.2)

    later = generate(400, 3000, seed=62, prefix="late")
    sender = Sender(kafka_bootstrap, f"{app_id}-commands", later, rate=300)
    time.sleep(2.0)
    victim = active(a)
    killed_at = time.time()
    a.kill()
    sender.join()

    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    gap = gap_after(events, victim, killed_at)
    print(f"kill -9 -> first event of partitions {sorted(victim)}: {gap:.3f} s")
    assert gap <= 2.0, f"failover took {gap:.2f} s"
    assert_exactly_the_model(kafka_bootstrap, app_id, first + later, [b])


def test_a_rolling_restart_moves_nothing_and_restores_only_the_tail(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    instances = {n: production(service_factory, n, tmp_path) for n in ("a", "b")}
    for instance in instances.values():
        instance.wait_ready()
    first = generate(300, 2000, seed=71)
    feed(kafka_bootstrap, app_id, first)
    later = generate(300, 4000, seed=72, prefix="roll")
    sender = Sender(kafka_bootstrap, f"{app_id}-commands", later, rate=250)
    for name, instance in list(instances.items()):
        other = instances["b" if name == "a" else "a"]
        _, before = other.get("/v1/stats")
        owned = active(instance)
        stopped_at = time.time()
        assert instance.stop() == 0
        again = service_factory(
            TARGET,
            name,
            state_dir=tmp_path / f"state-{name}",
            web_port=int(instance.env["ENHYDRA_WEB_PORT"]),
            extra_env={"ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "false"},
            start=False,
        )
        for variable in TEST_TIMEOUTS:
            again.env.pop(variable, None)
        again.start().wait_ready()
        back_at = time.time()
        instances[name] = again
        _, after = other.get("/v1/stats")
        assert after["rebalances"] == before["rebalances"], "the group rebalanced"
        assert active(again) == owned, "the restarted instance got other tasks"
        _, stats = again.get("/v1/stats")
        restored = sum(t["restore"].get("restored", 0) for t in stats["tasks"].values())
        assert restored == 0, f"restored {restored} records instead of its tail (none)"
        print(f"{name}: down {back_at - stopped_at:.2f} s, no rebalance, nothing restored")
    sender.join()
    assert_exactly_the_model(kafka_bootstrap, app_id, first + later, list(instances.values()))


def test_a_paused_instance_is_removed_and_rejoins_losing_nothing(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    a = production(service_factory, "a", tmp_path)
    b = production(service_factory, "b", tmp_path)
    a.wait_ready()
    b.wait_ready()
    first = generate(300, 2000, seed=81)
    feed(kafka_bootstrap, app_id, first)
    later = generate(300, 3000, seed=82, prefix="pause")
    sender = Sender(kafka_bootstrap, f"{app_id}-commands", later, rate=250)
    time.sleep(1.0)
    victim = active(a)
    assert a.process is not None
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        # Silent on HTTP and on the control topic for the probe window (5 s): removed.
        wait_until(lambda: victim <= active(b), 20, step=0.2)
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    a.wait_ready(timeout=90)  # it rejoins under the same instance id
    sender.join()
    assert "removing dead peer" in b.log_tail(400)
    assert_exactly_the_model(kafka_bootstrap, app_id, first + later, [a, b])


def test_a_stalled_http_port_alone_removes_nobody(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    a = production(service_factory, "a", tmp_path)
    b = production(service_factory, "b", tmp_path)
    a.wait_ready()
    b.wait_ready()
    feed(kafka_bootstrap, app_id, generate(200, 1000, seed=91))
    _, before_b = b.get("/v1/stats")
    _, before_a = a.get("/v1/stats")
    later = generate(200, 2000, seed=92, prefix="stall")
    sender = Sender(kafka_bootstrap, f"{app_id}-commands", later, rate=200)
    with stalled_port(int(a.env["ENHYDRA_WEB_PORT"])):
        time.sleep(12)  # beyond the probe window: only HTTP is silent, Kafka is not
        _, during_b = b.get("/v1/stats")
    sender.join()
    _, after_a = a.get("/v1/stats")
    assert during_b["rebalances"] == before_b["rebalances"], "a was removed"
    assert after_a["processed"] > before_a["processed"], "a stopped processing"
    assert "removing dead peer" not in b.log_tail(400)


def test_a_scale_down_hands_its_tasks_over_at_once(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    """POST /v1/admin/leave: leave the group and stop, without waiting for the session timeout."""
    token = {"ENHYDRA_ADMIN_TOKEN": "adm"}
    a = production(service_factory, "a", tmp_path, **token)
    b = production(service_factory, "b", tmp_path, **token)
    a.wait_ready()
    b.wait_ready()
    commands = generate(200, 1000, seed=95)
    feed(kafka_bootstrap, app_id, commands)
    leaving = active(a)
    assert leaving
    request = urllib.request.Request(
        a.url + "/v1/admin/leave", method="POST", headers={"Authorization": "Bearer adm"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 202
    asked_at = time.monotonic()
    assert a.process is not None and a.process.wait(30) == 0
    took = wait_until(lambda: active(b) == {0, 1, 2, 3}, 20, step=0.1)
    print(f"scale-down: b runs every partition {time.monotonic() - asked_at:.2f} s after the ask")
    assert took < 10, "b waited for the session timeout"  # 30 s at these settings
    assert "left the group" in a.log_tail(50)
    assert read_accounts([b], sorted(model(commands))) == model(commands)
