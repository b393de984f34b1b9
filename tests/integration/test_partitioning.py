"""A command placed by another client's partitioner is refused, on a real broker.

The wrong ones are produced with a plain aiokafka producer and an explicit partition, where
librdkafka's default partitioner (CRC32) would put them, between commands placed as Kafka's
default partitioner does.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import zlib

import pytest

from enhydra.admin.dlq import read_dead_letters, replay
from enhydra.contracts.partitioner import partition_for
from enhydra.errors.dlq import Selection
from enhydra.kafka.clients import open_producer
from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"  # deserialization errors go to the DLQ
PARTITIONS = 4


def crc32_partition(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


async def produce_at(bootstrap: str, topic: str, records: list[tuple[str, dict, int]]) -> None:
    async with open_producer(bootstrap, acks="all") as producer:
        for key, value, partition in records:
            await producer.send_and_wait(
                topic, json.dumps(value).encode(), key=key.encode(), partition=partition
            )


def test_a_command_on_another_partition_than_its_key_is_dead_lettered_and_changes_nothing(
    service_factory, kafka_bootstrap, app_id
):
    instance = service_factory(TARGET, "p1")
    instance.wait_ready()
    valid = generate(40, 400, seed=71)
    accounts = sorted({key for key, _ in valid})
    victims = [a for a in accounts if crc32_partition(a) != partition_for(a.encode(), 4)][:2]
    wrong = [
        (key, {"command_id": f"wrong-{i}", "type": "deposit", "account": key, "amount": 1000})
        for i, key in enumerate(victims)
    ]
    topic = f"{app_id}-commands"
    feed(kafka_bootstrap, app_id, valid[:200])
    placed = [(key, value, crc32_partition(key)) for key, value in wrong]
    asyncio.run(produce_at(kafka_bootstrap, topic, placed))
    feed(kafka_bootstrap, app_id, valid[200:])

    expected = model(valid)
    assert read_accounts([instance], accounts) == expected
    assert instance.alive()
    status, _ = instance.get("/health/ready")
    assert status == 200

    letters = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-dlq"))
    found = {}
    for letter in letters:
        h = {k: v.decode() for k, v in letter.headers}
        found[letter.key.decode()] = h
    assert sorted(found) == sorted(victims)
    for key, h in found.items():
        right, arrived = partition_for(key.encode(), 4), crc32_partition(key)
        assert h["enhydra.dlq.stage"] == "deserialize"
        assert h["enhydra.dlq.error.class"] == "enhydra.contracts.partitioner.MispartitionedRecord"
        assert h["enhydra.dlq.partition"] == str(arrived)
        message = h["enhydra.dlq.error.message"]
        assert f"belongs on partition {right}" in message
        assert f"arrived on partition {arrived}" in message
        assert "partitioner=murmur2_random" in message
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    ids = {dict(e.headers).get("enhydra.command_id", b"").decode() for e in events}
    assert not {value["command_id"] for _, value in wrong} & ids

    with urllib.request.urlopen(instance.url + "/metrics", timeout=5) as response:
        metrics = response.read().decode()
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("enhydra_failed_records_total") and "MispartitionedRecord" in line
    ]
    assert len(counted) == 1 and counted[0].endswith(f" {len(victims)}"), counted

    # The way back once the producer is fixed: a replay is keyed, so it lands where it belongs.
    chosen = Selection(error_class="MispartitionedRecord").select(
        asyncio.run(read_dead_letters(kafka_bootstrap, f"{app_id}-dlq"))
    )
    assert asyncio.run(replay(kafka_bootstrap, f"{app_id}-dlq", chosen)) == len(victims)
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, topic, timeout=60))
    fixed = model(valid + wrong)
    assert fixed != expected and read_accounts([instance], accounts) == fixed
