"""Create the topics a service needs, and refuse to start on topics that cannot work.

A commands topic with a different partition count than the changelog would route keys to the
wrong store partition, so a mismatch is a start-up error naming the topic, never a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from enhydra.logs import get_logger

log = get_logger("enhydra.topics")


class TopicError(RuntimeError):
    """A topic exists with a layout the service cannot use."""


HISTORY_RETENTION = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = 1
    config: dict[str, str] = field(default_factory=dict)
    compacted: bool = False
    # An event-sourced history (the events topic, the dead letters) is the source of truth: a
    # rebuild replays it from offset 0, so the broker must never delete it by age or size.
    history: bool = False

    def new_topic(self) -> NewTopic:
        config = dict(self.config)
        if self.compacted:
            config.setdefault("cleanup.policy", "compact")
        if self.history:
            for name, value in HISTORY_RETENTION.items():
                config.setdefault(name, value)
        return NewTopic(self.name, self.partitions, self.replication_factor, topic_configs=config)


async def partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition count of each existing topic among `names`."""
    described = await admin.describe_topics(names)
    counts: dict[str, int] = {}
    for topic in described:
        if topic.get("error_code", 0) == 0 and topic.get("partitions"):
            counts[topic["topic"]] = len(topic["partitions"])
    return counts


async def ensure_topics(
    bootstrap: str, specs: list[TopicSpec], *, client_id: str = "enhydra", timeout: float = 30.0
) -> None:
    """Create missing topics; verify existing ones have the expected partition count.

    Several instances may start at once and race to create the same topics; metadata of a
    topic just created takes a moment to show, so this retries until every topic is visible.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout
        created: set[str] = set()
        while True:
            existing = set(await admin.list_topics())
            missing = [s for s in specs if s.name not in existing and s.name not in created]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):  # another instance was first
                    await admin.create_topics([s.new_topic() for s in missing])
                for spec in missing:
                    created.add(spec.name)
                    log.info("topic created", topic=spec.name, partitions=spec.partitions)
            counts = await partition_counts(admin, [s.name for s in specs])
            absent = [s.name for s in specs if s.name not in counts]
            if not absent:
                break
            if time.monotonic() > deadline:
                raise TopicError(f"topics {absent} could not be created or described")
            await asyncio.sleep(0.3)
        for spec in specs:
            found = counts[spec.name]
            if found != spec.partitions:
                raise TopicError(
                    f"topic {spec.name!r} has {found} partitions but the service expects "
                    f"{spec.partitions} (ENHYDRA_PARTITIONS); keys would be routed to the wrong "
                    "store partition. Use a new app id or repartition the topic."
                )
        kept = [s.name for s in specs if s.history and s.name not in created]
        await warn_on_history_loss(admin, kept)
    finally:
        await admin.close()


def history_loss(configs: dict[str, str]) -> list[str]:
    """The settings of an existing topic under which the broker would delete its history."""
    return [
        f"{name}={configs[name]}"
        for name, kept in HISTORY_RETENTION.items()
        if name in configs and configs[name] != kept
    ]


async def warn_on_history_loss(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Warn about history topics made elsewhere with a finite retention or compaction.

    A warning, not an error: a team may keep a bounded history on purpose (tiered storage,
    rebuilds from snapshots). The service still runs; a backfill from offset 0 would refuse.
    """
    if not names:
        return
    wanted = dict.fromkeys(HISTORY_RETENTION)
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, wanted) for name in names]
    for response in await admin.describe_configs(resources):
        for error_code, _message, _type, name, entries in response.resources:
            if error_code:
                continue
            losing = history_loss({entry[0]: entry[1] for entry in entries})
            if losing:
                log.warning(
                    "events history will be deleted by the broker",
                    topic=name,
                    settings=losing,
                    fix=f"kafka-configs --alter --entity-type topics --entity-name {name} "
                    "--add-config retention.ms=-1,retention.bytes=-1,cleanup.policy=delete",
                )
