"""Consumer groups seen from the outside: members, committed offsets, commits, rejoining."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, UnknownMemberIdError
from aiokafka.structs import OffsetAndMetadata

from enhydra.kafka.clients import Admin, Consumer, open_consumer
from enhydra.kafka.membership import remove_static_members
from enhydra.settings import Connection

UNKNOWN_MEMBER_ID = ""  # what aiokafka calls a consumer that has not joined yet


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


def member_id(consumer: Consumer | None) -> str | None:
    """The member id the group gave this consumer (None before it joined)."""
    coordinator = getattr(consumer, "_coordinator", None)
    member = getattr(coordinator, "member_id", None)
    return member if member and member != UNKNOWN_MEMBER_ID else None


async def stop_coordination(consumer: Consumer) -> str | None:
    """Stop joining and heartbeating, and return the member id the group last gave us.

    Until then a member removed from its group is told so at its next heartbeat and rejoins
    by itself (KIP-345: a static member's JoinGroup re-adds it), so a LeaveGroup sent while
    the coordinator still runs can be undone a few hundred milliseconds later. aiokafka's
    coordinator sends no LeaveGroup for a static member and forgets the member id as its last
    step; the id is read just before that.
    """
    coordinator = consumer._coordinator
    if coordinator is None:
        return None
    last: list[str | None] = [member_id(consumer)]
    forget = coordinator._maybe_leave_group

    async def remember_then_forget() -> None:
        last.append(member_id(consumer))
        await forget()

    coordinator._maybe_leave_group = remember_then_forget
    await coordinator.close()
    return last[-1]


async def leave_group(consumer: Consumer, group_id: str, instance_id: str) -> bool:
    """Leave now as the static member `instance_id` (aiokafka's stop() does not, by design).

    The consumer stops taking part in the group first, so nothing rejoins after the leave; it
    can still be closed as usual. True when the group let this member go (or no longer had it).
    """
    member = await stop_coordination(consumer)
    result = await remove_static_members(
        consumer._client, group_id, {instance_id: member}, reason="scale-down"
    )
    error = result.get(instance_id)
    return error is None or isinstance(error, UnknownMemberIdError)


def fenced(error: BaseException) -> bool:
    """Whether `error` says another process joined the group under this static member's id.

    aiokafka does not know Kafka's FENCED_INSTANCE_ID (82): its heartbeat fails with an
    UnknownError, which a static member sees only in this case.
    """
    text = str(error)
    return isinstance(error, KafkaError) and "heartbeat" in text and "UnknownError" in text
