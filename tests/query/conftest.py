"""Three real ledger instances shared by the query tests: starting them costs the most time.

The instances require a query token; i1 and i2 have an admin token, i3 has none (its admin
endpoints must not exist). Tests that disturb the group (rebalances, instances leaving) start
their own instances instead of using this cluster.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from enhydra.testing.processes import ServiceProcess, service_env
from ledger.workload import generate, model
from tests.integration.ledger_support import feed

TARGET = "ledger.service:service"
QUERY_TOKEN = "query-secret"
ADMIN_TOKEN = "admin-secret"
PARTITIONS = 6


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any
    raw: bytes = b""


def call(
    url: str,
    *,
    token: str | None = QUERY_TOKEN,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Answer:
    """One HTTP request; the body is decoded when it is JSON."""
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    return Answer(status, got, body, raw)


def instance_env(
    app_id: str, bootstrap: str, name: str, root: Path, zone: str, *, admin: bool, **extra: str
) -> dict[str, str]:
    env = {
        "ENHYDRA_NUM_STANDBY_REPLICAS": "1",
        "ENHYDRA_CLIENT_TAGS": f"zone={zone}",
        "ENHYDRA_QUERY_TOKEN": QUERY_TOKEN,
        **({"ENHYDRA_ADMIN_TOKEN": ADMIN_TOKEN} if admin else {}),
        **extra,
    }
    return service_env(
        app_id=app_id,
        bootstrap=bootstrap,
        instance_id=name,
        state_dir=root / f"state-{name}",
        partitions=PARTITIONS,
        extra=env,
    )


def wait_until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.25)


def settled(instances: list[ServiceProcess], *, current_standbys: bool = True) -> bool:
    """Every instance sees all of them, every partition has an active owner (standbys current)."""
    names = {inst.instance_id for inst in instances}
    for inst in instances:
        answer = call(inst.url + "/v1/metadata")
        if answer.status != 200 or answer.body["rebalancing"] or not answer.body["ready"]:
            return False
        described = answer.body["instances"]
        if {i["id"] for i in described} != names or not all(i["reachable"] for i in described):
            return False
        owned = sorted(p for i in described for p in i["stores"]["accounts"]["active"])
        if owned != list(range(PARTITIONS)):
            return False
        for i in described if current_standbys else ():
            if any(t["lag"] is None or t["lag"] > 0 for t in i["tasks"].values()):
                return False
    return True


@dataclass
class Cluster:
    app_id: str
    bootstrap: str
    instances: list[ServiceProcess]
    commands: list = field(default_factory=list)

    @property
    def expected(self) -> dict[str, dict]:
        return model(self.commands)

    @property
    def accounts(self) -> list[str]:
        return sorted({key for key, _ in self.commands})

    def by_id(self, name: str) -> ServiceProcess:
        return next(inst for inst in self.instances if inst.instance_id == name)


def start_instances(
    app_id: str, bootstrap: str, root: Path, names: list[str], admin: set[str]
) -> list[ServiceProcess]:
    instances = []
    for zone, name in zip("abc", names, strict=False):
        env = instance_env(app_id, bootstrap, name, root, zone, admin=name in admin)
        instances.append(ServiceProcess(TARGET, env, root / f"{name}.log").start())
    for inst in instances:
        inst.wait_ready(90)
    return instances


@pytest.fixture(scope="package")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """i1, i2, i3 with 6 partitions, one standby each, 300 accounts fed and processed."""
    root = tmp_path_factory.mktemp("query-cluster")
    app_id = f"t-query-{uuid.uuid4().hex[:8]}"
    instances = start_instances(app_id, kafka_bootstrap, root, ["i1", "i2", "i3"], {"i1", "i2"})
    try:
        commands = generate(300, 3000, seed=61)
        feed(kafka_bootstrap, app_id, commands)
        wait_until(lambda: settled(instances), 90, "the group to settle with current standbys")
        yield Cluster(app_id, kafka_bootstrap, instances, commands)
    finally:
        for inst in instances:
            try:
                inst.stop(timeout=30)
            except TimeoutError:
                inst.kill()
