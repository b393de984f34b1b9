"""Create the topics a service needs, and refuse to start on topics that cannot work.

A commands topic with a different partition count than the changelog would route keys to the
wrong store partition, so a mismatch is a start-up error naming the topic, never a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)

from enhydra.kafka.clients import Admin, as_connection, open_admin
from enhydra.kafka.errors import explain
from enhydra.logs import get_logger
from enhydra.settings import Connection

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


async def partition_counts(admin: Admin, names: list[str]) -> dict[str, int]:
    """Partition count of each existing topic among `names`."""
    described = await admin.describe_topics(names)
    _raise_topic_errors(
        [(t["topic"], t.get("error_code", 0), "") for t in described], tolerate=(_UNKNOWN_TOPIC,)
    )
    counts: dict[str, int] = {}
    for topic in described:
        if topic.get("error_code", 0) == 0 and topic.get("partitions"):
            counts[topic["topic"]] = len(topic["partitions"])
    return counts


_TOPIC_EXISTS = TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = UnknownTopicOrPartitionError.errno


def _raise_topic_errors(errors: list[tuple], tolerate: tuple[int, ...] = (_TOPIC_EXISTS,)) -> None:
    """aiokafka's admin returns per-topic error codes instead of raising: raise the first."""
    for topic, code, message, *_ in errors:
        if code and code not in tolerate:
            raise for_code(code)(f"{topic}: {message or 'error ' + str(code)}")


async def ensure_topics(
    conn: Connection | str,
    specs: list[TopicSpec],
    *,
    client_id: str = "enhydra",
    timeout: float = 30.0,
) -> None:
    """Create missing topics; verify existing ones have the expected partition count.

    Several instances may start at once and race to create the same topics; metadata of a
    topic just created takes a moment to show, so this retries until every topic is visible.
    """
    conn = as_connection(conn)
    async with open_admin(conn, client_id=client_id) as admin:
        try:
            await _ensure(admin, specs, timeout)
        except KafkaError as exc:
            names = ", ".join(s.name for s in specs)
            raise explain(exc, conn, doing=f"create or describe the topics {names}") from exc


async def _ensure(admin: Admin, specs: list[TopicSpec], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    created: set[str] = set()
    while True:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing and s.name not in created]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another instance was first
                response = await admin.create_topics([s.new_topic() for s in missing])
                _raise_topic_errors(response.topic_errors)
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


async def recreate_topics(
    conn: Connection | str, specs: list[TopicSpec], *, timeout: float = 60.0
) -> None:
    """Delete the topics (when they exist) and create them anew, empty, as `specs` say.

    A deleted topic's name is free again only once the controller has finished deleting it,
    so creation is retried until then.
    """
    if not specs:
        return
    async with open_admin(as_connection(conn), client_id="enhydra-admin") as admin:
        names = [s.name for s in specs]
        existing = [name for name in names if name in set(await admin.list_topics())]
        if existing:
            await admin.delete_topics(existing)
        deadline = time.monotonic() + timeout
        while set(names) & set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise TopicError(f"topics {names} were not deleted within {timeout:.0f}s")
            await asyncio.sleep(0.3)
        while True:
            try:
                await admin.create_topics([s.new_topic() for s in specs])
                return
            except TopicAlreadyExistsError:  # deletion still settling on the controller
                if time.monotonic() > deadline:
                    raise TopicError(f"topics {names} could not be recreated") from None
                await asyncio.sleep(0.5)


def history_loss(configs: dict[str, str]) -> list[str]:
    """The settings of an existing topic under which the broker would delete its history."""
    return [
        f"{name}={configs[name]}"
        for name, kept in HISTORY_RETENTION.items()
        if name in configs and configs[name] != kept
    ]


async def warn_on_history_loss(admin: Admin, names: list[str]) -> None:
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


async def max_message_bytes(
    conn: Connection | str, names: list[str], *, client_id: str = "enhydra"
) -> dict[str, int]:
    """Each existing topic's max.message.bytes (its own or the broker's default): the largest
    record batch the broker accepts for it. Topics that do not exist are left out."""
    conn = as_connection(conn)
    wanted = {"max.message.bytes": None}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, wanted) for name in names]
    limits: dict[str, int] = {}
    async with open_admin(conn, client_id=client_id) as admin:
        try:
            responses = await admin.describe_configs(resources)
        except KafkaError as exc:
            raise explain(exc, conn, doing=f"describe the topics {', '.join(names)}") from exc
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            for entry in entries if not error_code else ():
                if entry[0] == "max.message.bytes" and entry[1]:
                    limits[name] = int(entry[1])
    return limits
