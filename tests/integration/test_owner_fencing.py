"""At-least-once: a cut-off owner's late changelog write never replaces a newer state.

The fault without the network cut: the previous owner's last changelog records are produced
again, as its producer would deliver them once the network heals, after the next owner wrote
newer entries for the same keys. Real broker, real processes, real RocksDB.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import ConsumerRebalanceListener

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.partitioner import partition_for
from enhydra.kafka.clients import close, new_consumer, open_producer, start
from enhydra.kafka.liveness import GroupLiveness
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.testing.processes import read_topic
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"
PARTITIONS = 4


def last_per_key(bootstrap: str, topic: str) -> dict[bytes, object]:
    return {r.key: r for r in asyncio.run(read_topic(bootstrap, topic))}


def newest_states(bootstrap: str, topic: str) -> dict[str, object]:
    """The state in each key's last changelog record: what compaction keeps."""
    last = last_per_key(bootstrap, topic)
    return {key.decode(): decode_entry(r.value).state for key, r in last.items() if r.value}


async def land_late(bootstrap: str, topic: str, records: list) -> None:
    """What the cut-off owner's producer delivers once its network heals."""
    async with open_producer(bootstrap, acks="all") as producer:
        for r in records:
            await producer.send_and_wait(
                topic, r.value, key=r.key, partition=r.partition, headers=list(r.headers)
            )


@pytest.mark.slow
def test_a_late_write_of_a_previous_owner_is_skipped_on_restore_and_repaired(
    service_factory, kafka_bootstrap, app_id
):
    env = {"ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "true"}
    changelog = f"{app_id}-accounts-changelog"
    commands = generate(40, 800, seed=41)
    first, second = commands[:400], commands[400:]
    # Commands of other accounts only: the owner writes in every partition again, never
    # the keys the zombie wrote.
    later = generate(24, 60, seed=43, prefix="later")
    assert {partition_for(k.encode(), PARTITIONS) for k, _ in later} == set(range(PARTITIONS))

    one = service_factory(TARGET, "one", extra_env=env, partitions=PARTITIONS)
    one.wait_ready()
    feed(kafka_bootstrap, app_id, first)
    one.stop()  # the previous owner; its last entries are what it would deliver late
    old = last_per_key(kafka_bootstrap, changelog)

    two = service_factory(TARGET, "two", extra_env=env, partitions=PARTITIONS)
    two.wait_ready()
    feed(kafka_bootstrap, app_id, second)
    newer = last_per_key(kafka_bootstrap, changelog)
    zombie = [r for key, r in old.items() if newer[key].offset > r.offset]
    assert len(zombie) > 10
    asyncio.run(land_late(kafka_bootstrap, changelog, zombie))
    feed(kafka_bootstrap, app_id, later)  # the owner's next batches find the late records
    expected = model(commands + later)
    assert newest_states(kafka_bootstrap, changelog) == expected
    # Late again, and then nothing more to process: the idle owner finds them by itself.
    asyncio.run(land_late(kafka_bootstrap, changelog, zombie))
    deadline = time.monotonic() + 30
    while newest_states(kafka_bootstrap, changelog) != expected:
        assert time.monotonic() < deadline, "an idle owner did not repair a late write"
        time.sleep(1)
    two.stop()

    three = service_factory(TARGET, "three", extra_env=env, partitions=PARTITIONS)
    three.wait_ready()  # a fresh instance: restores every partition from the changelog
    assert read_accounts([three], sorted(expected)) == expected
    assert newest_states(kafka_bootstrap, changelog) == expected, "last records are stale"


async def test_heartbeats_of_a_real_group_member_confirm_its_membership(kafka_bootstrap, app_id):
    """aiokafka's heartbeat call is the one GroupLiveness times: a version that renames it
    must fail here, not leave every at-least-once batch unconfirmed."""
    topic = f"{app_id}-input"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    consumer = new_consumer(
        kafka_bootstrap, group_id=app_id, session_timeout_ms=6000, heartbeat_interval_ms=200
    )
    group = GroupLiveness(lambda: consumer)
    assigned = asyncio.Event()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked) -> None:
            pass

        async def on_partitions_assigned(self, partitions) -> None:
            group.assigned()
            assigned.set()

    consumer.subscribe([topic], listener=Listener())
    await start(consumer, kafka_bootstrap)
    try:
        while not assigned.is_set():
            await consumer.getmany(timeout_ms=100)
        joined_at = group.confirmed
        assert group.generation() >= 1
        await asyncio.sleep(1.0)
        assert group.confirmed > joined_at, "no heartbeat was timed"
        assert await group.confirmed_within(0.5, wait_s=0)
    finally:
        await close(consumer)
