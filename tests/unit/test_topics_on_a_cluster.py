"""ensure_topics on a cluster whose brokers learn of a new topic one after another."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest
from aiokafka.errors import UnknownTopicOrPartitionError

from enhydra.kafka import topics
from enhydra.kafka.topics import Durability, TopicSpec

UNKNOWN = UnknownTopicOrPartitionError.errno


class LaggingAdmin:
    """Knows the topics (they were just created), but its DescribeConfigs answers "unknown
    topic" `unknown_for` times first, as a broker whose metadata is behind does."""

    def __init__(self, names: list[str], unknown_for: int) -> None:
        self.names = names
        self.unknown_for = unknown_for
        self.config_calls = 0

    async def list_topics(self) -> list[str]:
        return list(self.names)

    async def describe_topics(self, names: list[str]) -> list[dict]:
        parts = [{"partition": p, "replicas": [1, 2, 3]} for p in range(4)]
        return [{"topic": n, "error_code": 0, "partitions": parts} for n in names]

    async def describe_configs(self, resources) -> list[SimpleNamespace]:
        self.config_calls += 1
        lagging = self.config_calls <= self.unknown_for
        entries = [("cleanup.policy", "compact", 0, 0, 0), ("min.insync.replicas", "2", 0, 0, 0)]
        return [
            SimpleNamespace(
                resources=[
                    (UNKNOWN if lagging else 0, "", 2, r.name, [] if lagging else entries)
                    for r in resources
                ]
            )
        ]


def run_with(admin: LaggingAdmin, monkeypatch: pytest.MonkeyPatch, timeout: float) -> None:
    @contextlib.asynccontextmanager
    async def open_admin(conn, **_):
        yield admin

    async def durability_for(admin, conn) -> Durability:
        return Durability(replication_factor=3, min_insync_replicas=2, brokers=3)

    monkeypatch.setattr(topics, "open_admin", open_admin)
    monkeypatch.setattr(topics, "durability_for", durability_for)
    monkeypatch.setattr(topics.asyncio, "sleep", _no_wait)
    spec = TopicSpec("app-accounts-changelog", 4, compacted=True)
    asyncio.run(topics.ensure_topics("127.0.0.1:9092", [spec], timeout=timeout))


async def _no_wait(_: float) -> None:
    return None


def test_a_topic_a_broker_does_not_know_yet_is_described_again(monkeypatch) -> None:
    admin = LaggingAdmin(["app-accounts-changelog"], unknown_for=3)
    run_with(admin, monkeypatch, timeout=30)
    assert admin.config_calls == 4


def test_a_topic_still_unknown_at_the_deadline_stops_the_start_in_one_line(monkeypatch) -> None:
    admin = LaggingAdmin(["app-accounts-changelog"], unknown_for=10**9)
    with pytest.raises(Exception, match="a topic does not exist"):
        run_with(admin, monkeypatch, timeout=0)
