"""Offline application reset, like kafka-streams-application-reset: reprocess from a point.

A reset makes the next start of the application behave as if it had never processed anything
after the chosen point:

1. refuse while any instance is still in the application's group (or a projection's group);
2. move the group's committed offsets on the commands topic to the point: the beginning, the
   first record at or after a time, or a snapshot's cut (`p=offset,...`);
3. move every projection group to the current end of the events topic: the events produced by
   reprocessing come after it, so read models are rebuilt from them and nothing twice;
4. delete and recreate the internal topics: the stores' changelogs (and the DLQ on request);
5. wipe the local state directory of the application (each machine must wipe its own).

The plan is computed from facts about the cluster by a pure function (`plan_reset`), shown by
`--dry-run`, and applied by `apply_reset`.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from enhydra.kafka.clients import as_connection, open_admin, open_consumer
from enhydra.kafka.groups import commit_offsets, consumer_groups, group_members
from enhydra.kafka.topics import (
    TopicError,
    TopicSpec,
    partition_counts,
    recreate_topics,
    require_creatable,
)
from enhydra.settings import Connection


class ResetError(RuntimeError):
    """The reset cannot be done as asked; nothing was changed when this is raised early."""


# --------------------------------------------------------------------------- what to reset to


@dataclass(frozen=True)
class ResetPoint:
    """Where the commands topic is reprocessed from: earliest, a time, or explicit offsets."""

    kind: str  # "earliest" | "datetime" | "offsets"
    timestamp_ms: int | None = None
    offsets: dict[int, int] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind == "datetime":
            when = dt.datetime.fromtimestamp((self.timestamp_ms or 0) / 1000, dt.UTC)
            return f"first record at or after {when.isoformat()}"
        if self.kind == "offsets":
            return "offsets " + ",".join(f"{p}={o}" for p, o in sorted(self.offsets.items()))
        return "earliest"


def parse_datetime(value: str) -> ResetPoint:
    """An ISO 8601 time (UTC unless it says otherwise) or epoch milliseconds."""
    if value.isdigit():
        return ResetPoint("datetime", timestamp_ms=int(value))
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ResetError(
            f"--to-datetime {value!r}: expected ISO 8601 (2026-11-22T10:00:00Z) or epoch ms"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return ResetPoint("datetime", timestamp_ms=int(parsed.timestamp() * 1000))


def parse_offsets(value: str) -> ResetPoint:
    """`0=120,1=98,...`: per partition, the next offset to process (a snapshot's cut)."""
    offsets: dict[int, int] = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        partition, sep, offset = item.partition("=")
        if not sep or not partition.strip().isdigit() or not offset.strip().isdigit():
            raise ResetError(f"--to-offsets item {item!r}: expected partition=offset, e.g. 0=120")
        if int(partition) in offsets:
            raise ResetError(f"--to-offsets gives partition {partition} twice")
        offsets[int(partition)] = int(offset)
    if not offsets:
        raise ResetError("--to-offsets is empty: expected partition=offset[,partition=offset...]")
    return ResetPoint("offsets", offsets=offsets)


# --------------------------------------------------------------------------- facts and plan


@dataclass
class ClusterFacts:
    """What the cluster says about an application, read by `gather_facts`."""

    topics: dict[str, int]  # every topic -> partition count
    members: dict[str, list[str]]  # group -> client ids of its active members
    projection_groups: list[str]
    beginning: dict[int, int]  # commands partition -> earliest offset
    end: dict[int, int]  # commands partition -> end offset
    by_time: dict[int, int | None] = field(default_factory=dict)  # offsets_for_times
    events_end: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ResetPlan:
    app_id: str
    group: str
    commands_topic: str
    offsets: dict[int, int]
    recreate: list[TopicSpec]
    events_topic: str
    projection_groups: list[str]
    events_offsets: dict[int, int]
    state_dir: Path | None
    point: ResetPoint

    def describe(self) -> list[str]:
        lines = [
            f"reset of application {self.app_id!r} to {self.point.describe()}:",
            f"  group {self.group}: offsets on {self.commands_topic} -> "
            + ", ".join(f"{p}={o}" for p, o in sorted(self.offsets.items())),
        ]
        for group in self.projection_groups:
            lines.append(
                f"  group {group}: offsets on {self.events_topic} -> current end "
                + ", ".join(f"{p}={o}" for p, o in sorted(self.events_offsets.items()))
            )
        for spec in self.recreate:
            kind = "compacted, " if spec.compacted else ""
            lines.append(f"  delete and recreate {spec.name} ({kind}{spec.partitions} partitions)")
        if self.state_dir is not None:
            lines.append(f"  delete local state {self.state_dir}")
        else:
            lines.append(
                "  local state: not touched (pass --state-dir, or wipe each instance's volume; "
                "a store ahead of its recreated changelog is also wiped at start)"
            )
        return lines


def internal_topics(app_id: str, topics: Mapping[str, int], *, include_dlq: bool) -> list[str]:
    """The app's changelogs (and DLQ), not those of another app whose id extends this one.

    `ledger-v2-accounts-changelog` belongs to app `ledger-v2` when `ledger-v2-commands` exists,
    even though it starts with `ledger-`.
    """
    prefix = f"{app_id}-"
    others = [
        name.removesuffix("-commands")
        for name in topics
        if name.endswith("-commands") and name.startswith(prefix) and name != f"{app_id}-commands"
    ]

    def ours(name: str) -> bool:
        return not any(name.startswith(other + "-") for other in others)

    found = sorted(t for t in topics if t.startswith(prefix) and t.endswith("-changelog"))
    chosen = [t for t in found if ours(t)]
    if include_dlq and f"{app_id}-dlq" in topics:
        chosen.append(f"{app_id}-dlq")
    return chosen


def plan_reset(
    app_id: str,
    facts: ClusterFacts,
    point: ResetPoint,
    *,
    commands_topic: str | None = None,
    events_topic: str | None = None,
    include_dlq: bool = False,
    state_dir: Path | None = None,
) -> ResetPlan:
    """What a reset will do, or a ResetError saying why it must not run (pure)."""
    commands = commands_topic or f"{app_id}-commands"
    events = events_topic or f"{app_id}-events"
    if commands not in facts.topics:
        raise ResetError(f"no topic {commands!r}: is the app id {app_id!r} right?")
    busy = {g: m for g, m in facts.members.items() if m}
    if busy:
        shown = "; ".join(f"{g}: {', '.join(sorted(m))}" for g, m in sorted(busy.items()))
        raise ResetError(
            f"the application is running ({shown}): stop every instance, then reset "
            "(a reset under a running instance would be overwritten by its next commit)"
        )
    partitions = sorted(facts.end)
    if point.kind == "earliest":
        offsets = dict(facts.beginning)
    elif point.kind == "datetime":
        offsets = {
            p: facts.by_time[p] if facts.by_time.get(p) is not None else facts.end[p]
            for p in partitions
        }
    else:
        unknown = sorted(set(point.offsets) - set(partitions))
        missing = sorted(set(partitions) - set(point.offsets))
        if unknown or missing:
            raise ResetError(
                f"--to-offsets must give every partition of {commands} (0..{len(partitions) - 1})"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else "")
            )
        for p, offset in point.offsets.items():
            if not facts.beginning[p] <= offset <= facts.end[p]:
                raise ResetError(
                    f"--to-offsets {p}={offset} is outside {commands}-{p}'s offsets "
                    f"{facts.beginning[p]}..{facts.end[p]}"
                )
        offsets = dict(point.offsets)
    recreate = []
    for name in internal_topics(app_id, facts.topics, include_dlq=include_dlq):
        compacted = name.endswith("-changelog")
        spec = TopicSpec(name, facts.topics[name], compacted=compacted, history=not compacted)
        recreate.append(spec)
    return ResetPlan(
        app_id=app_id,
        group=app_id,
        commands_topic=commands,
        offsets=offsets,
        recreate=recreate,
        events_topic=events,
        projection_groups=sorted(facts.projection_groups),
        events_offsets=dict(facts.events_end) if facts.projection_groups else {},
        state_dir=state_dir / app_id if state_dir is not None else None,
        point=point,
    )


# --------------------------------------------------------------------------- I/O


async def gather_facts(
    conn: Connection | str,
    app_id: str,
    point: ResetPoint,
    *,
    commands_topic: str | None = None,
    events_topic: str | None = None,
) -> ClusterFacts:
    """Read topics, group members and offsets: everything `plan_reset` needs."""
    commands = commands_topic or f"{app_id}-commands"
    events = events_topic or f"{app_id}-events"
    conn = as_connection(conn)
    async with open_admin(conn, client_id="enhydra-reset") as admin:
        names = [t for t in await admin.list_topics() if not t.startswith("__")]
        topics = await partition_counts(admin, names) if names else {}
        groups = await consumer_groups(admin)
        projection_groups = [g for g in groups if g.startswith(f"{app_id}-projection-")]
        members = {g: await group_members(admin, g) for g in [app_id, *projection_groups]}
    facts = ClusterFacts(topics, members, projection_groups, {}, {})
    if commands not in topics:
        return facts
    async with open_consumer(conn) as consumer:
        tps = [TopicPartition(commands, p) for p in range(topics[commands])]
        facts.beginning = {
            tp.partition: o for tp, o in (await consumer.beginning_offsets(tps)).items()
        }
        facts.end = {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
        if point.kind == "datetime":
            found = await consumer.offsets_for_times({tp: point.timestamp_ms for tp in tps})
            facts.by_time = {tp.partition: (r.offset if r else None) for tp, r in found.items()}
        if projection_groups and events in topics:
            etps = [TopicPartition(events, p) for p in range(topics[events])]
            facts.events_end = {
                tp.partition: o for tp, o in (await consumer.end_offsets(etps)).items()
            }
    return facts


async def apply_reset(conn: Connection | str, plan: ResetPlan) -> None:
    """Do what the plan says, in the order that keeps a half-done reset safe to repeat."""
    conn = as_connection(conn)
    if plan.recreate:  # nothing rewound unless the topics can be made again
        try:
            await require_creatable(conn)
        except TopicError as exc:
            raise ResetError(str(exc)) from exc
    await commit_offsets(conn, plan.group, plan.commands_topic, plan.offsets)
    for group in plan.projection_groups:
        await commit_offsets(conn, group, plan.events_topic, plan.events_offsets)
    try:
        await recreate_topics(conn, plan.recreate)
    except TopicError as exc:
        raise ResetError(str(exc)) from exc
    if plan.state_dir is not None:
        shutil.rmtree(plan.state_dir, ignore_errors=True)
