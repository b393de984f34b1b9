"""Consumer groups seen from the outside: members, committed offsets, commits, rejoining."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from enhydra.kafka.clients import Admin, Consumer, open_consumer
from enhydra.settings import Connection


async def group_members(admin: Admin, group: str, *, attempts: int = 40) -> list[str]:
    """Client ids of the group's current members ([] when the group is empty or unknown).

    One group per request: aiokafka 0.14 misdecodes several groups' v3 answers at once. A
    fresh broker needs a moment to load its group coordinators, so retriable errors are retried.
    """
    for attempt in range(attempts):
        try:
            responses = await admin.describe_consumer_groups([group])
            break
        except KafkaError as exc:
            if not exc.retriable or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    members: list[str] = []
    for response in responses:
        for described in response.groups:
            members.extend(member[1] for member in described[5])
    return members


async def consumer_groups(admin: Admin) -> list[str]:
    return [group for group, _ in await admin.list_consumer_groups()]


async def committed_offsets(admin: Admin, group: str) -> dict[TopicPartition, int]:
    """The group's committed offsets per topic partition."""
    found = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in found.items()}


async def commit_offsets(
    conn: Connection, group: str, topic: str, offsets: Mapping[int, int]
) -> None:
    """Commit offsets for a group with no members (a 'simple' commit, without joining)."""
    async with open_consumer(conn, group_id=group) as consumer:
        tps = {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)


def request_rejoin(consumer: Consumer) -> None:
    """Make a group member rejoin now (a probing rebalance); aiokafka has no public call."""
    consumer._coordinator.request_rejoin()
