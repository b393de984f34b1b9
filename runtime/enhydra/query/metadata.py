"""Who hosts what: this instance's own view, the group's view, and where a key lives.

The group map comes from the leader's last assignment, which every member receives, so any
instance can route any key without asking anyone. Lags are live numbers only the instance
holding a copy knows: this instance reports its own, and the others' come from their
`/v1/stats` (their own report), fetched when metadata is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from enhydra.contracts.partitioner import partition_for
from enhydra.query import rejections

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine
    from enhydra.projections.engine import ProjectionEngine


def local_report(engine: Engine, instance_id: str, store: str) -> dict[str, Any]:
    """What this instance says about itself: the body of /v1/stats."""
    settings = engine.settings
    registry = engine.registry
    return {
        "instance": instance_id,
        "url": settings.advertised_url,
        "tags": dict(settings.client_tags),
        "store": store,
        "partitions": settings.partitions,
        "ready": registry.ready,
        "joined": registry.joined,
        "rebalancing": registry.rebalancing,
        "rebalances": registry.rebalances,
        "stuck": {str(p): s.reason() for p, s in sorted(registry.stuck.items())},
        "failures": dict(engine.failures),
        "input_lag": {str(p): lag for p, lag in sorted(engine.input_lag().items())},
        "tasks": {
            str(p): {
                "role": t.role.value,
                "status": t.status.value,
                "processed": t.processed,
                "changelog_offset": t.store.changelog_offset,
                "lag": registry.task_lag(t),
                "restore": t.restore,
            }
            for p, t in sorted(registry.tasks.items())
        },
        "recent_rejections": rejections.recent(engine),
        **engine.stats,
    }


def projections_report(projections: Mapping[str, ProjectionEngine]) -> dict[str, Any]:
    """The read models hosted here: their tasks and counters, and their input lag (the events
    on the broker they have not folded yet) per active partition and in all."""
    report = {}
    for name, engine in sorted(projections.items()):
        lags = engine.input_lag()
        report[name] = {
            **engine.describe(),
            "lag": sum(lags.values()),
            "lags": {str(p): lag for p, lag in sorted(lags.items())},
        }
    return report


def reactions_report(reactions: Mapping[str, Any]) -> dict[str, Any]:
    """The reactions running here (name -> ReactionEngine): their tasks and counters, and their
    lag (the upstream events on the broker they have not turned into commands yet)."""
    report = {}
    for name, engine in sorted(reactions.items()):
        lags = engine.input_lag()
        report[name] = {
            **engine.describe(),
            "lag": sum(lags.values()),
            "lags": {str(p): lag for p, lag in sorted(lags.items())},
        }
    return report


def topology(engine: Engine) -> dict[str, Any]:
    """The topics around the store: what the status page draws."""
    aggregate = engine.aggregate
    specs = {spec.name for spec in engine.topic_specs()}
    settings = engine.settings
    return {
        "commands": aggregate.commands_topic,
        "store": aggregate.name,
        "events": aggregate.events_topic,
        "rejections": aggregate.rejections_topic,
        "changelog": aggregate.changelog_topic,
        "dlq": settings.dlq_topic if settings.dlq_topic in specs else None,
        "partitions": settings.partitions,
    }


def group_instances(engine: Engine, instance_id: str) -> dict[str, dict[str, Any]]:
    """Every member's URL, tags and partitions from the last assignment (self if none yet)."""
    registry = engine.registry
    instances = {name: dict(info) for name, info in registry.group.instances.items()}
    if instance_id not in instances:
        settings = engine.settings
        instances[instance_id] = {
            "url": settings.advertised_url,
            "tags": dict(settings.client_tags),
            "active": registry.active_partitions(),
            "standby": registry.standby_partitions(),
        }
    return instances


def describe_instance(
    name: str, info: dict[str, Any], report: dict[str, Any] | None, store: str, *, is_self: bool
) -> dict[str, Any]:
    """One instance for /v1/metadata: the assignment, refined by its own report when we have it."""
    tasks = report["tasks"] if report else {}
    warmup = sorted(int(p) for p, t in tasks.items() if t["role"] == "warmup")
    standby = sorted(p for p in info.get("standby", ()) if p not in warmup)
    lags = {p: t.get("lag") for p, t in tasks.items()}
    return {
        "id": name,
        "url": info.get("url", ""),
        "tags": info.get("tags", {}),
        "self": is_self,
        "reachable": report is not None,
        "ready": report.get("ready") if report else None,
        "stores": {
            store: {
                "active": sorted(info.get("active", ())),
                "standby": standby,
                "warmup": warmup,
                "lags": lags,
            }
        },
        "tasks": tasks,
        "failures": report.get("failures", {}) if report else {},
        "stuck": report.get("stuck", {}) if report else {},
        "processed": report.get("processed") if report else None,
        "rebalances": report.get("rebalances") if report else None,
        "projections": report.get("projections", {}) if report else {},
        "reactions": report.get("reactions", {}) if report else {},
        "sagas": report.get("sagas", {}) if report else {},
        "recent_rejections": report.get("recent_rejections", []) if report else [],
    }


def key_metadata(engine: Engine, store: str, key: bytes) -> dict[str, Any]:
    """The partition of `key` (murmur2, as producers use) and who hosts it."""
    partitions = engine.settings.partitions
    partition = partition_for(key, partitions)
    active = None
    standbys = []
    for name, info in sorted(engine.registry.group.instances.items()):
        entry = {"instance": name, "url": info.get("url", "")}
        if partition in info.get("active", ()):
            active = entry
        elif partition in info.get("standby", ()):
            standbys.append(entry)
    return {
        "store": store,
        "key": key.decode("utf-8"),
        "partition": partition,
        "partitions": partitions,
        "active": active,
        "standbys": standbys,
    }
