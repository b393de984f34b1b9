"""Static membership on the real broker: removal by group.instance.id, and restarts that keep
their assignment without a rebalance."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka.client import CoordinationType
from aiokafka.errors import UnknownMemberIdError
from aiokafka.protocol.api import Request

from enhydra.kafka.clients import open_admin, open_consumer
from enhydra.kafka.errors import KafkaAccessError
from enhydra.kafka.groups import group_members, leave_group, request_rejoin
from enhydra.kafka.membership import (
    FencedInstanceIdError,
    LeaveGroupMembersRequest,
    LeaveGroupRequest_v3,
    LeaveGroupRequest_v4,
    LeaveGroupRequest_v5,
    cluster_client,
    remove_static_members,
)
from tests.failover.support import PeerProcess, make_group_topics, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timing]

PARTITIONS = 4
SESSION_MS = 30_000


@pytest.fixture
def group(kafka_bootstrap):
    name = f"fo-{uuid.uuid4().hex[:8]}"
    asyncio.run(make_group_topics(kafka_bootstrap, name, f"{name}-in", PARTITIONS))
    return name


@pytest.fixture
def peers(kafka_bootstrap, group):
    started: list[PeerProcess] = []

    def start(instance: str, **options) -> PeerProcess:
        options = {
            "bootstrap": kafka_bootstrap,
            "group": group,
            "topic": f"{group}-in",
            "session_timeout_ms": SESSION_MS,
            **options,
        }
        peer = PeerProcess(instance, **options)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.close()


def both_assigned(a: PeerProcess, b: PeerProcess) -> bool:
    held = a.assignment() + b.assignment()
    return sorted(held) == list(range(PARTITIONS)) and bool(a.assignment()) and bool(b.assignment())


def test_a_killed_static_member_keeps_its_partitions_until_removed_then_they_move_at_once(
    kafka_bootstrap, group, peers
):
    survivor, victim = peers("s1"), peers("v1")
    wait_until(lambda: both_assigned(survivor, victim), 60)
    theirs = victim.assignment()
    victim.kill()  # SIGKILL: no LeaveGroup, and a static member would not send one anyway
    time.sleep(3)
    assert survivor.assignment() != list(range(PARTITIONS)), "moved before removal"

    removed_at = time.monotonic()
    result = asyncio.run(remove_static_members(kafka_bootstrap, group, ["v1"]))
    assert result == {"v1": None}
    took = wait_until(lambda: survivor.assignment() == list(range(PARTITIONS)), SESSION_MS / 3000)
    print(f"victim's partitions {theirs} reached the survivor {took:.2f} s after the removal")
    assert time.monotonic() - removed_at < SESSION_MS / 3000


def test_removal_reports_members_not_in_the_group_and_spares_a_newer_incarnation(
    kafka_bootstrap, group, peers
):
    member = peers("m1")
    first = member.wait_for(lambda e: e["event"] == "assigned", 60)

    result = asyncio.run(
        remove_static_members(kafka_bootstrap, group, {"m1": "an-older-member-id", "ghost": None})
    )
    assert isinstance(result["m1"], FencedInstanceIdError)  # m1 is someone newer: left alone
    assert isinstance(result["ghost"], UnknownMemberIdError)
    time.sleep(1)
    assert [e for e in member.events if e["event"] == "revoked"] == []

    result = asyncio.run(remove_static_members(kafka_bootstrap, group, {"m1": first["member"]}))
    assert result == {"m1": None}
    # the removed (but alive) instance is told at its next heartbeat and rejoins by itself
    rejoined = member.wait_for(
        lambda e: e["event"] == "assigned" and e["member"] != first["member"], 30
    )
    assert rejoined["partitions"] == list(range(PARTITIONS))

    no_group = asyncio.run(remove_static_members(kafka_bootstrap, f"{group}-none", ["m1"]))
    assert isinstance(no_group["m1"], UnknownMemberIdError)


@pytest.mark.parametrize(
    "struct", [LeaveGroupRequest_v3, LeaveGroupRequest_v4, LeaveGroupRequest_v5]
)
def test_every_leave_group_version_removes_by_instance_id_on_this_broker(
    kafka_bootstrap, group, struct
):
    """v3 (plain), v4 (flexible), v5 (with a reason), each pinned, against the real broker."""

    class Pinned(Request[struct]):  # type: ignore[valid-type]
        API_KEY = 13

        def __init__(self, inner: LeaveGroupMembersRequest) -> None:
            self.inner = inner

        def build(self, request_struct_class):  # type: ignore[no-untyped-def]
            return self.inner.build(request_struct_class)

    async def scenario() -> None:
        async with (
            open_consumer(
                kafka_bootstrap,
                group_id=group,
                group_instance_id="pinned",
                session_timeout_ms=SESSION_MS,
            ) as consumer,
            cluster_client(kafka_bootstrap) as client,
        ):
            consumer.subscribe([f"{group}-in"])
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=100)
            node = await client.coordinator_lookup(CoordinationType.GROUP, group)
            request = LeaveGroupMembersRequest(group, [("", "pinned"), ("", "ghost")], "test")
            response = await client.send(node, Pinned(request))
            assert response.API_VERSION == struct.API_VERSION
            assert response.error_code == 0
            codes = {m[1]: m[2] for m in response.members}
            assert codes == {"pinned": 0, "ghost": UnknownMemberIdError.errno}

    asyncio.run(scenario())


def test_a_restart_with_the_same_instance_id_gets_its_partitions_back_without_a_rebalance(
    group, peers
):
    survivor, victim = peers("s1"), peers("v1")
    wait_until(lambda: both_assigned(survivor, victim), 60)
    time.sleep(1)  # let any settling rebalance finish before counting
    seen = len(survivor.events)
    before = victim.assignment()
    victim.terminate()  # SIGTERM: a clean stop that does not leave the group
    restarted = len(victim.events)
    victim.start()  # same instance id, well within the 30 s session timeout
    back = victim.wait_for(lambda e: e["event"] == "assigned", 30, after=restarted)
    assert back["partitions"] == before
    time.sleep(2)
    assert [e["event"] for e in survivor.events[seen:]] == [], "the survivor saw a rebalance"


def test_bad_arguments_are_refused_plainly(kafka_bootstrap):
    with pytest.raises(ValueError, match=r"pass \['v1'\]"):
        asyncio.run(remove_static_members(kafka_bootstrap, "g", "v1"))
    with pytest.raises(ValueError, match="non-empty"):
        asyncio.run(remove_static_members(kafka_bootstrap, "g", [""]))
    assert asyncio.run(remove_static_members(kafka_bootstrap, "g", [])) == {}
    with pytest.raises(KafkaAccessError, match=r"127\.0\.0\.1:1"):
        asyncio.run(remove_static_members("127.0.0.1:1", "g", ["v1"], timeout_s=1))


def test_a_leaving_member_does_not_rejoin_before_it_closes(kafka_bootstrap, group):
    """The leave is final: a static member removed while its coordinator still ran was told so
    at its next heartbeat and rejoined, so a stopped instance stayed in the group (and a reset
    right after refused to run) until its session timed out."""

    async def scenario() -> tuple[list[str], list[str], bool]:
        async with open_admin(kafka_bootstrap) as admin:
            async with open_consumer(
                kafka_bootstrap,
                group_id=group,
                group_instance_id="leaver",
                client_id="leaver",
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=200,
            ) as consumer:
                consumer.subscribe([f"{group}-in"])
                while not consumer.assignment():
                    await consumer.getmany(timeout_ms=200)
                joined = await group_members(admin, group)
                request_rejoin(consumer)  # a rebalance under way as the instance stops
                left = await leave_group(consumer, group, "leaver")
                await asyncio.sleep(2)  # ten heartbeats: time to rejoin, were it still able
                after = await group_members(admin, group)
            return joined, after, left

    joined, after, left = asyncio.run(scenario())
    assert joined == ["leaver"]
    assert left and after == []
