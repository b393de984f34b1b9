"""pytest fixtures: one real Kafka broker per test session, unique names, real instances.

Set ENHYDRA_TEST_BOOTSTRAP to use an already running broker instead of starting one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from enhydra.testing.processes import ServiceProcess, service_env


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """bootstrap servers of a real Apache Kafka broker (KRaft) on 127.0.0.1."""
    external = os.environ.get("ENHYDRA_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    from enhydra.broker.local import LocalBroker

    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), port=0)
    info = broker.start()
    try:
        yield info.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def app_id(request: pytest.FixtureRequest) -> str:
    """An application id no other test uses, so topics and groups never collide."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def service_factory(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> Iterator[Callable[..., ServiceProcess]]:
    """Start instances of a service as processes; every one is stopped at teardown.

    factory(target, instance_id="i1", state_dir=None, extra_env=None, start=True, cwd=None)
    """
    started: list[ServiceProcess] = []

    def factory(
        target: str,
        instance_id: str = "i1",
        *,
        state_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        partitions: int = 4,
        web_port: int | None = None,
        start: bool = True,
        cwd: Path | None = None,
    ) -> ServiceProcess:
        env = service_env(
            app_id=app_id,
            bootstrap=kafka_bootstrap,
            instance_id=instance_id,
            state_dir=state_dir or tmp_path / f"state-{instance_id}",
            web_port=web_port,
            partitions=partitions,
            extra=extra_env,
        )
        proc = ServiceProcess(target, env, tmp_path / f"{instance_id}.log", cwd=cwd)
        started.append(proc)
        if start:
            proc.start()
        return proc

    yield factory
    for proc in started:
        try:
            proc.stop(timeout=30)
        except TimeoutError:
            proc.kill()
