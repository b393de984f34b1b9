"""pytest fixtures: one real Kafka broker per test session, unique names, real instances.

The session's broker also opens SASL_SSL and mutual-TLS listeners (`secured_kafka`), so
security is tested on the same broker as everything else. Set ENHYDRA_TEST_BOOTSTRAP to use an
already running broker instead; the secured tests then start a local secured broker of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from enhydra.settings import Connection
from enhydra.testing.processes import ServiceProcess, service_env

BROKER_START_TIMEOUT_S = 240.0  # the CLI's default stays 60 s


@dataclass(frozen=True)
class SecuredKafka:
    """The secured listeners of a local broker, as connections a test can use or pass on."""

    sasl_ssl: Connection  # SCRAM-SHA-512 as the admin (a super user)
    mtls: Connection  # SSL with the client certificate (a super user)
    limited: Connection  # SASL_SSL as a user without any ACL: authenticated, not authorized
    password: str  # the admin's, to check it never shows up anywhere


def secured_connections(info) -> SecuredKafka:  # info: enhydra.devtools.broker.BrokerInfo
    from enhydra.devtools.broker_security import ADMIN_USER, LIMITED_USER

    files = info.security_files

    def scram(user: str) -> Connection:
        return Connection(
            bootstrap_servers=info.sasl_ssl_bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=user,
            sasl_password_file=files.password_file(user),
            ssl_cafile=files.ca,
        )

    mtls = Connection(
        bootstrap_servers=info.ssl_bootstrap,
        security_protocol="SSL",
        ssl_cafile=files.ca,
        ssl_certfile=files.client_cert,
        ssl_keyfile=files.client_key,
    )
    return SecuredKafka(scram(ADMIN_USER), mtls, scram(LIMITED_USER), files.password(ADMIN_USER))


@pytest.fixture(scope="session")
def _local_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A local broker with every listener, started once per session (per xdist worker).

    The start may take minutes on a loaded machine where every worker starts its own broker at
    the same moment: the deadline is generous, the readiness check is the broker's.
    """
    from enhydra.devtools.broker import LocalBroker

    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), port=0, secured=True)
    info = broker.start(timeout=BROKER_START_TIMEOUT_S)
    try:
        yield info
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """bootstrap servers of a real Apache Kafka broker (KRaft) on 127.0.0.1 (PLAINTEXT)."""
    external = os.environ.get("ENHYDRA_TEST_BOOTSTRAP")
    if external:
        return external
    return request.getfixturevalue("_local_broker").bootstrap


@pytest.fixture(scope="session")
def secured_kafka(request: pytest.FixtureRequest) -> SecuredKafka:
    """SASL_SSL (SCRAM) and mTLS connections to a real broker, plus a user without ACLs."""
    return secured_connections(request.getfixturevalue("_local_broker"))


def _proxied(tmp_path_factory: pytest.TempPathFactory, brokers: int) -> Iterator[object]:
    from enhydra.testing.faults import ProxiedKafka

    kafka = ProxiedKafka(tmp_path_factory.mktemp(f"faults-{brokers}"), brokers)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def proxied_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One broker reached through Toxiproxy, one lane per instance ("i1", "i2"): fault tests.

    A testing.faults.ProxiedKafka; started only by the tests that ask for it (it builds
    Toxiproxy with `go` the first time, unless `make setup` did).
    """
    yield from _proxied(tmp_path_factory, 1)


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A 3-node KRaft cluster (replication factor 3, min.insync.replicas 2) behind Toxiproxy,
    lanes "i1" and "i2"; `.cluster.node(n)` stops, kills and restarts node n."""
    yield from _proxied(tmp_path_factory, 3)


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
