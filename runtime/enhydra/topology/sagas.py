"""Sagas in the topology: each saga, its forwarders (listed as reactions) and its topics.

A saga's forwarders are reactions, so they appear in the `reactions` section with a `saga`
field: the AsyncAPI document gets their receive operations on the upstream channels, and
`enhydra topology check` compares the event types they read with the upstreams' contracts,
exactly as for a reaction. The `sagas` section adds what only a saga has: its inbox, its
group and changelog (moving either loses the pending deadlines), and the commands it sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from enhydra.sagas.model import Saga


def saga_sections(
    sagas: Sequence[Saga], app_id: str, commands_topic: str, partitions: int, digest: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(forwarders as reaction entries, saga entries, internal topics) of `sagas`."""
    from enhydra.topology.model import qualified_name
    from enhydra.topology.reactions import reaction_section

    forwarders: list[dict[str, Any]] = []
    section: list[dict[str, Any]] = []
    internal: list[dict[str, Any]] = []
    for saga in sorted(sagas, key=lambda s: s.name):
        inbox = saga.inbox_topic(app_id)
        for entry in reaction_section(saga.forwarders(), app_id, inbox, partitions, digest):
            entry["saga"] = saga.name
            forwarders.append(entry)
        changelog = saga.changelog_topic(app_id)
        section.append(
            {
                "name": saga.name,
                "sources": sorted(saga.sources),
                "inbox": inbox,
                "group": saga.group_id(app_id),
                "changelog": changelog,
                "partitions": partitions,
                "sends": sorted({commands_topic, *saga.sends_to}),
                "correlate": qualified_name(saga.correlate),
                "handle": qualified_name(saga.handle),
                "code": digest(saga.correlate, saga.handle),
            }
        )
        internal.append({"name": inbox, "role": "saga-inbox", "saga": saga.name})
        internal.append({"name": changelog, "role": "changelog", "saga": saga.name})
        for topic in internal[-2:]:
            topic.update(partitions=partitions)
        internal[-1]["compacted"] = True
    return forwarders, section, internal


def saga_changes(old: list, new: list, ok: Any, bad: Any) -> list[Any]:
    """What `enhydra topology check` says of sagas: moving a saga's inbox, group or changelog
    strands its state and pending deadlines (incompatible); its logic may change."""
    from enhydra.topology.compat import Path

    changes = []
    old_by = {s.get("name"): s for s in old}
    new_by = {s.get("name"): s for s in new}
    for name in sorted(new_by.keys() - old_by.keys()):
        changes.append(ok(f"saga {name}", "saga added"))
    # Flagged (not compatible) though the deploy itself is a rolling bounce: the topology
    # cannot know whether deadlines are pending, and losing them is silent at run time.
    for name in sorted(old_by.keys() - new_by.keys()):
        detail = (
            "saga removed: its pending deadlines never fire; its topics stay until deleted "
            "(cancel them first, or accept losing them)"
        )
        changes.append(bad(f"saga {name}", detail, Path.ROLLING_BOUNCE))
    for name in sorted(old_by.keys() & new_by.keys()):
        o, n = old_by[name], new_by[name]
        for topic in sorted(set(o.get("sends") or ()) - set(n.get("sends") or ())):
            detail = (
                f"no longer sends to {topic}: pending deadlines that send there go to the "
                "dead-letter queue when they fire"
            )
            changes.append(bad(f"saga {name}", detail, Path.ROLLING_BOUNCE))
        for field in ("inbox", "group", "changelog"):
            if o.get(field) != n.get(field):
                detail = (
                    f"{field} changed: {o.get(field)} -> {n.get(field)} (the saga's state and "
                    "pending deadlines stay behind)"
                )
                changes.append(bad(f"saga {name}", detail))
        if o.get("code") != n.get("code"):
            changes.append(ok(f"saga {name}", "saga logic changed (applies from now)"))
    return changes
