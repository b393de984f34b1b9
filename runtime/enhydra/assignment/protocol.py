"""The assignor on Kafka's group protocol: what members send when they join, what they get back.

Each member's subscription carries its instance id, URL, tags, previous tasks and, per task it
has local state for, its changelog lag (end offset minus local checkpoint). The leader runs the
pure `assign` and sends each member its active partitions (the consumer assignment) plus, in the
user data, its standby and warm-up tasks and the whole group's task map (for query routing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from enhydra.assignment.assignor import AssignmentConfig, ClientState, assign
from enhydra.logs import get_logger

log = get_logger("enhydra.assignment")

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class MemberReport:
    """What this instance says about itself when it (re)joins the group."""

    instance_id: str
    url: str
    tags: Mapping[str, str]
    active: frozenset[int]
    standby: frozenset[int]
    lags: Mapping[int, int]

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": PROTOCOL_VERSION,
                "instance": self.instance_id,
                "url": self.url,
                "tags": dict(self.tags),
                "active": sorted(self.active),
                "standby": sorted(self.standby),
                "lags": {str(t): lag for t, lag in self.lags.items()},
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> MemberReport:
        raw = orjson.loads(data)
        return cls(
            instance_id=raw["instance"],
            url=raw.get("url", ""),
            tags=raw.get("tags", {}),
            active=frozenset(raw.get("active", ())),
            standby=frozenset(raw.get("standby", ())),
            lags={int(t): lag for t, lag in raw.get("lags", {}).items()},
        )


@dataclass(frozen=True)
class GroupMap:
    """Every instance's URL, tags and tasks, as the leader decided them."""

    instances: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def active_owner(self, partition: int) -> str | None:
        for instance, info in self.instances.items():
            if partition in info["active"]:
                return instance
        return None


@dataclass(frozen=True)
class MemberAssignment:
    """What this instance was given beyond its consumer partitions."""

    standby: frozenset[int] = frozenset()
    warmup: frozenset[int] = frozenset()
    probing_rebalance_needed: bool = False
    group: GroupMap = field(default_factory=GroupMap)

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": PROTOCOL_VERSION,
                "standby": sorted(self.standby),
                "warmup": sorted(self.warmup),
                "probing": self.probing_rebalance_needed,
                "group": self.group.instances,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> MemberAssignment:
        if not data:
            return cls()
        raw = orjson.loads(data)
        return cls(
            standby=frozenset(raw.get("standby", ())),
            warmup=frozenset(raw.get("warmup", ())),
            probing_rebalance_needed=bool(raw.get("probing")),
            group=GroupMap(raw.get("group", {})),
        )


class TaskAssignor(AbstractPartitionAssignor):
    """aiokafka assignor that delegates every decision to the pure `assign`."""

    name = "enhydra-ha-v1"
    version = PROTOCOL_VERSION

    def __init__(
        self,
        topic: str,
        config: AssignmentConfig,
        report: Callable[[], MemberReport],
        on_assignment: Callable[[MemberAssignment], None],
    ) -> None:
        self.topic = topic
        self.config = config
        self._report = report
        self._on_assignment = on_assignment

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), self._report().encode())

    def assign(  # type: ignore[override]
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        partitions = cluster.partitions_for_topic(self.topic) or set()
        reports: dict[str, MemberReport] = {}
        client_of_member: dict[str, str] = {}
        for member_id, meta in sorted(members.items()):
            report = MemberReport.decode(meta.user_data)
            client_id = report.instance_id
            if client_id in reports:  # two members claim one instance id: keep them apart
                client_id = f"{client_id}#{member_id}"
            reports[client_id] = report
            client_of_member[member_id] = client_id
        clients = [
            ClientState(
                client_id=cid,
                tags=r.tags,
                previous_active=r.active,
                previous_standby=r.standby,
                lags=r.lags,
            )
            for cid, r in reports.items()
        ]
        result = assign(sorted(partitions), clients, self.config)
        group = GroupMap(
            {
                cid: {
                    "url": reports[cid].url,
                    "tags": dict(reports[cid].tags),
                    "active": sorted(a.active),
                    "standby": sorted(a.standby | a.warmup),
                }
                for cid, a in result.clients.items()
            }
        )
        log.info(
            "assignment computed",
            members=len(members),
            active={cid: sorted(a.active) for cid, a in result.clients.items()},
            standby={cid: sorted(a.standby) for cid, a in result.clients.items()},
            warmup={cid: sorted(a.warmup) for cid, a in result.clients.items() if a.warmup},
            pending_moves=dict(result.pending_moves),
        )
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member_id, cid in client_of_member.items():
            mine = result.clients[cid]
            extra = MemberAssignment(
                standby=mine.standby,
                warmup=mine.warmup,
                probing_rebalance_needed=result.probing_rebalance_needed,
                group=group,
            )
            out[member_id] = ConsumerProtocolMemberAssignment(
                self.version, [(self.topic, sorted(mine.active))], extra.encode()
            )
        return out

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        self._on_assignment(MemberAssignment.decode(assignment.user_data))
