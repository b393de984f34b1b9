"""Reactions in the topology, and the contract between a reacting service and its upstream.

A reaction declares the upstream event types it reads (msgspec Structs); their JSON Schemas
are this service's side of the contract. The upstream's side is its published contract, kept
as a file in this service's repository: its AsyncAPI document (`enhydra asyncapi`) or its
topology baseline (topology.json). The check asks, for each type read, whether every event
the upstream writes today still fits the type the reaction reads: a field the reaction needs
that the upstream dropped, a type or an enum the upstream widened beyond what the reaction
accepts, a type the upstream no longer publishes. Each finding names both services.

All pure: plain JSON in, findings out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from enhydra.evolution import TYPE_FIELD
from enhydra.reactions.model import Reaction
from enhydra.topology.schema import schema_differences

CONTRACTS_DIR = "contracts"  # upstream contracts in a project: contracts/<upstream app>.json


class ContractError(ValueError):
    """An upstream contract file is neither an AsyncAPI document nor a topology."""


def reaction_section(
    reactions: Sequence[Reaction], app_id: str, commands_topic: str, partitions: int, digest: Any
) -> list[dict[str, Any]]:
    """Each reaction as the topology lists it: what it reads, from where, what it writes."""
    from enhydra.topology.model import qualified_name

    schema_of: Any = None
    if any(r.reads for r in reactions):
        from enhydra.messages import json_schema as schema_of
    section = []
    for reaction in sorted(reactions, key=lambda r: r.name):
        section.append(
            {
                "name": reaction.name,
                "source": reaction.source,
                "input": reaction.upstream_topic,
                "group": reaction.group_id(app_id),
                "changelog": reaction.changelog_topic(app_id),
                "partitions": partitions,
                "sends": sorted({commands_topic, *reaction.sends_to}),
                "react": qualified_name(reaction.react),
                "code": digest(reaction.react),
                "reads": {
                    name: schema_of(cls) for name, cls in sorted(reaction.reads_by_type().items())
                },
            }
        )
    return section


@dataclasses.dataclass(frozen=True)
class Upstream:
    """What an upstream contract says it publishes: event type -> current JSON Schema."""

    app_id: str
    events_topic: str
    events: dict[str, dict[str, Any] | None]  # None: the type is published, its schema unknown
    source: str  # the file it came from
    # True when the upstream declares every event type it writes (a typed aggregate): a type
    # it does not list is not written. An untyped one lists only the types it versions.
    complete: bool = True


def read_contract(document: Mapping[str, Any], source: str) -> Upstream:
    """The events an upstream publishes, from its AsyncAPI document or its topology."""
    if "asyncapi" in document:
        return _from_asyncapi(document, source)
    if str(document.get("format", "")).startswith("enhydra.topology/"):
        return _from_topology(document, source)
    raise ContractError(
        f"{source}: neither an AsyncAPI document nor an Enhydra topology (save the upstream's "
        "`enhydra asyncapi` output or its topology.json there)"
    )


def _from_topology(topology: Mapping[str, Any], source: str) -> Upstream:
    events_topic = next(
        (t["name"] for t in topology.get("output_topics") or () if t.get("role") == "events"),
        f"{topology.get('app_id')}-events",
    )
    events: dict[str, dict[str, Any] | None] = {}
    for name, event in ((topology.get("messages") or {}).get("events") or {}).items():
        version = str(event.get("version", 1))
        events[name] = (event.get("schemas") or {}).get(version)
    typed = bool((topology.get("messages") or {}).get("typed"))
    return Upstream(str(topology.get("app_id")), events_topic, events, source, complete=typed)


def _from_asyncapi(document: Mapping[str, Any], source: str) -> Upstream:
    app_id = str((document.get("info") or {}).get("title") or "?")
    channels = document.get("channels") or {}
    send_events = (document.get("operations") or {}).get("sendEvents") or {}
    ref = str((send_events.get("channel") or {}).get("$ref") or "")
    events_topic = ref.rsplit("/", 1)[-1] if ref else f"{app_id}-events"
    channel = channels.get(events_topic)
    if not isinstance(channel, Mapping):
        raise ContractError(f"{source}: no events channel {events_topic!r} in the document")
    shared = (document.get("components") or {}).get("schemas") or {}
    events: dict[str, dict[str, Any] | None] = {}
    complete = True
    for name, message in (channel.get("messages") or {}).items():
        if name in ("event", "anyEvent"):  # an untyped service's catch-all: any other type
            complete = False
            continue
        payload = message.get("payload")
        events[name] = _local_refs(payload, shared) if isinstance(payload, Mapping) else None
    if not complete:  # an untyped service's listed types carry only their tag, no fields
        events = {n: None if _tag_only(e) else e for n, e in events.items()}
    return Upstream(app_id, events_topic, events, source, complete=complete)


def _tag_only(schema: Mapping[str, Any] | None) -> bool:
    return schema is None or set(schema.get("properties") or {}) <= {TYPE_FIELD}


def _local_refs(payload: Mapping[str, Any], shared: Mapping[str, Any]) -> dict[str, Any]:
    """A payload whose `#/components/schemas/X` refs point into its own `$defs`."""

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (
                    v.replace("#/components/schemas/", "#/$defs/")
                    if k == "$ref" and isinstance(v, str)
                    else rewrite(v)
                )
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    schema = rewrite(dict(payload))
    if shared:
        schema["$defs"] = rewrite(dict(shared))
    return schema


@dataclasses.dataclass(frozen=True)
class Finding:
    """One way an upstream's contract breaks what a reaction of this service reads."""

    downstream: str  # this service
    reaction: str
    upstream: str
    event: str
    detail: str

    def line(self) -> str:
        return (
            f"{self.upstream} -> {self.downstream}: reaction {self.reaction!r} reads "
            f"{self.upstream}'s event {self.event!r}: {self.detail}"
        )


def check_reactions(
    app_id: str, section: Sequence[Mapping[str, Any]], contracts: Mapping[str, Upstream]
) -> tuple[list[Finding], list[str]]:
    """(findings, reactions whose upstream has no contract here) for a topology's reactions.

    `contracts` maps an upstream app id to what it publishes. A type the reaction reads must be
    published, and every event of that type the upstream writes must fit the reaction's
    schema: schema_differences(upstream's, reaction's) is the reader-accepts-writer check.
    """
    findings: list[Finding] = []
    missing: list[str] = []
    for reaction in section:
        upstream = contracts.get(reaction["source"])
        if upstream is None:
            missing.append(reaction["name"])
            continue
        for event, reads in sorted((reaction.get("reads") or {}).items()):
            if event not in upstream.events:
                if not upstream.complete:
                    continue  # an untyped upstream may write it without listing it
                details = [f"{upstream.source} no longer lists it (removed or renamed)"]
            elif upstream.events[event] is None or reads is None:
                continue  # an untyped side: nothing to compare
            else:
                writes = _untagged(upstream.events[event])
                details = [
                    _as_contract(detail)
                    for compatible, detail in schema_differences(writes, _untagged(reads))
                    if not compatible
                ]
            findings += [
                Finding(app_id, reaction["name"], upstream.app_id, event, detail)
                for detail in details
            ]
    return findings, missing


def _untagged(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A schema without its "type" tag property: the tag is matched by name already, and each
    side spells it its own way (a const, a one-value enum)."""
    properties = dict(schema.get("properties") or {})
    properties.pop(TYPE_FIELD, None)
    required = [r for r in schema.get("required") or () if r != TYPE_FIELD]
    return {**schema, "properties": properties, "required": required}


# schema.py words its findings for an upgrade (old values, new reader); here the old values
# are what the upstream writes and the reader is the reaction.
_WORDING = {
    "new required field (old values lack it)": "read as required, the upstream does not write it",
    "now required (old values may lack it)": "read as required, optional in the upstream's events",
}


def _as_contract(detail: str) -> str:
    for upgrade, contract in _WORDING.items():
        if detail.endswith(upgrade):
            return detail.removesuffix(upgrade) + contract
    if ": enum no longer accepts " in detail:
        field, shown = detail.split(": enum no longer accepts ", 1)
        return f"{field}: the upstream writes values outside what is read here ({shown})"
    return f"{detail} (upstream's -> read here)"
