"""The local broker against a real Kafka: lifecycle, client round trip, CLI contract.

One broker is shared by the module (a start costs a few seconds); the tests run in file order
and each leaves it running.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

import enhydra
from enhydra.devtools.broker import PID_FILE, LocalBroker, read_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RUNTIME_DIR = Path(enhydra.__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), port=0)
    broker.start()
    yield broker
    broker.stop()


def bootstrap_of(broker: LocalBroker) -> str:
    info = broker.status()
    assert info is not None, "broker is not running"
    return info.bootstrap


async def create_topic(bootstrap: str, name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def list_topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `enhydra kafka ...` in a child process, capturing output like `$(...)` would."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RUNTIME_DIR), env.get("PYTHONPATH")]))
    code = "from enhydra.cli.kafka import kafka; kafka()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,  # also catches a broker that kept our stdout pipe open
        env=env,
        check=False,
    )


async def test_produce_and_consume(broker: LocalBroker) -> None:
    bootstrap = bootstrap_of(broker)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    # Transactional, as the runtime writes events: needs the single-replica txn state topic.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, key=b"order-1", value=b"placed")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        session_timeout_ms=2000,  # below Kafka's default minimum of 6 s
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
    finally:
        await consumer.stop()
    assert (record.key, record.value) == (b"order-1", b"placed")


async def test_topics_are_not_auto_created(broker: LocalBroker) -> None:
    bootstrap = bootstrap_of(broker)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    await producer.start()
    try:
        with pytest.raises((KafkaError, TimeoutError)):
            await asyncio.wait_for(producer.send_and_wait("tpyo-topic", b"x"), timeout=5)
    finally:
        await producer.stop()
    assert "tpyo-topic" not in await list_topics(bootstrap)


def test_start_is_idempotent(broker: LocalBroker) -> None:
    first = broker.status()
    assert first is not None
    assert broker.start() == first
    # Another handle on the same data dir, without a port, finds the same process.
    assert LocalBroker(broker.data_dir).start() == first


def test_cli_reuses_the_running_broker(broker: LocalBroker) -> None:
    info = broker.status()
    assert info is not None
    started = cli("start", "--data-dir", str(broker.data_dir))
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"bootstrap={info.bootstrap}\n"
    assert "reusing" in started.stderr
    status = cli("status", "--data-dir", str(broker.data_dir))
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines() == [f"bootstrap={info.bootstrap}", f"pid={info.pid}"]


def test_start_uses_the_kafka_already_answering_on_the_port(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """`make run` with BROKER_PORT of a running broker: no second broker, a note says so."""
    info = broker.status()
    assert info is not None
    started = cli("start", "--data-dir", str(tmp_path / "other"), "--port", str(info.port))
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"bootstrap={info.bootstrap}\n"
    assert f"Kafka already answers at {info.bootstrap}" in started.stderr
    assert LocalBroker(tmp_path / "other").status() is None


def test_start_without_a_data_dir_finds_the_broker_running_from_another(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell without ENHYDRA_BROKER_DIR finds the broker another shell started (this one
    lives in the temp folder, which the search leaves out: a test session's broker)."""
    from enhydra.cli import kafka as cli_kafka

    info = broker.status()
    assert info is not None
    monkeypatch.setattr(cli_kafka.tempfile, "gettempdir", lambda: str(tmp_path / "elsewhere"))
    assert info in cli_kafka.running_brokers()
    default = LocalBroker(tmp_path / "default")  # the cache folder's, not running
    if cli_kafka.running_brokers(exclude=default.data_dir) == [info]:  # no one else's here
        assert cli_kafka._running_elsewhere(default, None, explicit_dir=False) == info.bootstrap


async def test_restart_keeps_data(broker: LocalBroker) -> None:
    before = broker.status()
    assert before is not None
    topic = f"kept-{uuid.uuid4().hex[:8]}"
    await create_topic(before.bootstrap, topic)

    assert broker.stop() is True
    assert not broker.is_running()
    assert broker.status() is None
    assert not (broker.data_dir / PID_FILE).exists()
    assert broker.stop() is False
    state = read_state(broker.data_dir)
    assert state is not None and state.pid is None
    stopped = cli("status", "--data-dir", str(broker.data_dir))
    assert stopped.returncode == 1

    # Restart through the CLI: the output must come back although the broker keeps running.
    started = cli("start", "--data-dir", str(broker.data_dir))
    assert started.returncode == 0, started.stderr
    after = broker.status()
    assert after is not None
    assert after.pid != before.pid
    assert after.port == before.port  # the data dir remembers its port
    assert started.stdout == f"bootstrap={after.bootstrap}\n"
    assert topic in await list_topics(after.bootstrap)
