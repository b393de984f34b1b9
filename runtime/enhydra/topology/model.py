"""A service's topology as plain JSON data: what it reads, writes, stores, and with which code.

Built from the service definition and its settings only (no broker): the input topics with
their partition counts, the stores with their changelogs, key/value serdes and declared value
schemas, the handlers (qualified names and a digest of their source), the internal topics,
the projections and the reactions. `enhydra topology show` prints it; `enhydra topology check`
compares two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import marshal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from enhydra.aggregate import Aggregate
from enhydra.contracts.fingerprint import fingerprint
from enhydra.contracts.names import control_topic_name
from enhydra.plugins import message_types
from enhydra.projections.model import Projection
from enhydra.reactions.model import Reaction
from enhydra.sagas.model import Saga
from enhydra.spec import ResolvedService

if TYPE_CHECKING:
    from enhydra.service import Service

FORMAT = "enhydra.topology/1"
KEY_SERDE = "utf-8"
VALUE_SERDE = "json"
# A store value is the Entry envelope (offset, command ids, state) as JSON: see processing/core.
STORE_VALUE_SERDE = "enhydra.entry/1+json"
PROJECTION_VALUE_SERDE = "enhydra.projected/1+json"
SCHEMA_NAMES = ("key", "commands", "events", "state")


class TopologyError(ValueError):
    """A topology file or a schema declaration is malformed; the message says where."""


def qualified_name(fn: Callable[..., Any] | None) -> str | None:
    """`module:qualname` of a function, the way the topology names handlers."""
    if fn is None:
        return None
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"


def _source_digest(fn: Callable[..., Any]) -> bytes:
    try:
        return inspect.getsource(fn).encode("utf-8")
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return marshal.dumps(code.co_code) if code is not None else qualified_name(fn).encode()


def _components(fn: Callable[..., Any] | None) -> list[tuple[str, Callable[..., Any]]]:
    """A dispatching function's parts (see plugins.extend), or the function itself."""
    if fn is None:
        return []
    parts = getattr(fn, "parts", None)
    if callable(parts):
        return [(label, f) for label, f in parts() if f is not None]
    return [("base", fn)]


def code_digest(
    *fns: Callable[..., Any] | None, named: Sequence[tuple[str, Callable[..., Any]]] = ()
) -> str:
    """A digest of the handlers' source: it changes when their logic does.

    `named` adds functions under a label (an upcaster's step, a migration's): they are logic
    too, so changing one shows in `enhydra topology check` like a changed apply.
    """
    digest = hashlib.sha256()
    for fn in fns:
        for label, part in _components(fn):
            digest.update(label.encode() + b"\0" + _source_digest(part) + b"\0")
    for label, fn in named:
        digest.update(label.encode() + b"\0" + _source_digest(fn) + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def _evolution_functions(aggregate: Aggregate) -> list[tuple[str, Callable[..., Any]]]:
    """The aggregate's upcasters and state migrations, labelled by step, in a stable order."""
    upcasters = [
        (f"upcaster {name} {step}", fn)
        for (name, step), fn in sorted(aggregate.upcasters.items(), key=lambda item: item[0])
    ]
    migrations = [
        (f"state migration {step}", fn) for step, fn in sorted(aggregate.state_migrations.items())
    ]
    return upcasters + migrations


def _handler_names(fn: Callable[..., Any] | None) -> str | dict[str, str] | None:
    parts = _components(fn)
    if len(parts) == 1 and parts[0][0] == "base":
        return qualified_name(parts[0][1])
    if not parts:
        return None
    return {label: str(qualified_name(f)) for label, f in parts}


def _schemas(schemas: Mapping[str, Any] | None) -> dict[str, Any]:
    schemas = dict(schemas or {})
    unknown = sorted(set(schemas) - set(SCHEMA_NAMES))
    if unknown:
        raise TopologyError(
            f"unknown schema name(s) {unknown}: expected some of {', '.join(SCHEMA_NAMES)}"
        )
    key = schemas.get("key", "string")
    if isinstance(key, str):
        key = {"type": key}
    if not isinstance(key, dict) or not isinstance(key.get("type"), str):
        raise TopologyError(f"schemas['key'] = {key!r}: expected a JSON type name, e.g. 'string'")
    for name in ("commands", "events", "state"):
        value = schemas.get(name)
        if value is not None and not isinstance(value, dict):
            raise TopologyError(f"schemas[{name!r}] must be a JSON Schema object, not {value!r}")
    return {"key": key, **{n: schemas.get(n) for n in ("commands", "events", "state")}}


def messages_section(aggregate: Aggregate) -> dict[str, Any]:
    """The aggregate's message contracts: command and event types with their JSON Schemas
    (derived from typed declarations, messages.py), event versions with their upcaster steps,
    and the state's version with its migration steps.

    Untyped aggregates list the event types they version, without schemas. The command and
    event types of handlers (plugins.extend: generated handlers, installed plugins) are listed
    too, with the schemas of the Structs they declare. The baseline (baseline.py) keeps the
    schema of every event version ever deployed next to these.
    """
    typed = aggregate.typed
    handler_commands, handler_events = message_types(aggregate)
    declared = [*handler_commands.values(), *handler_events.values()]
    schema_of: Any = None
    if typed is not None or any(cls is not None for cls in declared):
        from enhydra.messages import json_schema as schema_of
    commands: dict[str, Any] = {}
    events: dict[str, Any] = {}
    if typed is not None:
        for name, cls in zip(typed.command_names, typed.command_types, strict=True):
            commands[name] = {"schema": schema_of(cls)}
        for name, cls in zip(typed.event_names, typed.event_types, strict=True):
            version = aggregate.event_versions.get(name, 1)
            events[name] = {"version": version, "schemas": {str(version): schema_of(cls)}}
    for name, cls in handler_commands.items():
        commands.setdefault(name, {"schema": schema_of(cls) if cls is not None else None})
    for name, cls in handler_events.items():
        version = aggregate.event_versions.get(name, 1)
        schemas = {str(version): schema_of(cls)} if cls is not None else {}
        events.setdefault(name, {"version": version, "schemas": schemas})
    for name, version in aggregate.event_versions.items():
        events.setdefault(name, {"version": version, "schemas": {}})
    for name, event in events.items():
        event["upcasters"] = sorted(s for (n, s) in aggregate.upcasters if n == name)
    state_schema = None
    if typed is not None and typed.state_type is not None:
        state_schema = schema_of(typed.state_type)
    return {
        "store": aggregate.name,
        "typed": typed is not None,
        "commands": dict(sorted(commands.items())),
        "events": dict(sorted(events.items())),
        "state": {
            "version": aggregate.state_version,
            "migrations": sorted(aggregate.state_migrations),
            "schema": state_schema,
        },
    }


def build_topology(
    app_id: str,
    aggregate: Aggregate,
    *,
    partitions: int,
    replication_factor: int | None = None,  # None: the broker's default.replication.factor
    dlq_topic: str | None = None,
    projections: Sequence[tuple[Projection, str | None]] = (),
    schemas: Mapping[str, Any] | None = None,
    commands_topic: str | None = None,
    reactions: Sequence[Reaction] = (),
    sagas: Sequence[Saga] = (),
) -> dict[str, Any]:
    """The topology of one service as JSON-ready data (pure: no settings, no broker).

    A service with reactions gets a `reactions` section (absent otherwise, so the topology of a
    service without any is what it was before reactions existed); so does one with sagas (whose
    forwarders are listed as reactions, topology/sagas.py)."""
    bound = aggregate.bind(app_id)
    if commands_topic:  # the settings may point the service at another input topic
        bound = dataclasses.replace(bound, commands_topic=commands_topic)
    declared = _schemas(schemas)
    key = {"type": declared["key"]["type"], "serde": KEY_SERDE}
    internal: list[dict[str, Any]] = [
        {
            "name": bound.changelog_topic,
            "role": "changelog",
            "store": aggregate.name,
            "partitions": partitions,
            "compacted": True,
        }
    ]
    if dlq_topic:
        internal.append({"name": dlq_topic, "role": "dlq", "partitions": partitions})
    internal.append({"name": control_topic_name(app_id), "role": "control", "partitions": 1})
    projected = []
    for projection, plugin in sorted(projections, key=lambda pair: pair[0].name):
        changelog = projection.changelog_topic(app_id)
        internal.append(
            {
                "name": changelog,
                "role": "changelog",
                "store": projection.name,
                "partitions": partitions,
                "compacted": True,
            }
        )
        projected.append(
            {
                "name": projection.name,
                "plugin": plugin,
                "source": bound.events_topic,
                "group": projection.group_id(app_id),
                "store": projection.name,
                "changelog": changelog,
                "partitions": partitions,
                "key": dict(key),
                "value": {"serde": PROJECTION_VALUE_SERDE},
                "project": qualified_name(projection.project),
                "code": code_digest(projection.project),
            }
        )
    reacting = []
    if reactions:
        from enhydra.topology.reactions import reaction_section

        reacting = reaction_section(
            reactions, app_id, bound.commands_topic, partitions, code_digest
        )
        for reaction in reacting:
            internal.append(
                {
                    "name": reaction["changelog"],
                    "role": "changelog",
                    "reaction": reaction["name"],
                    "partitions": partitions,
                    "compacted": True,
                }
            )
    saga_list: list[dict[str, Any]] = []
    if sagas:
        from enhydra.topology.sagas import saga_sections

        forwarders, saga_list, saga_topics = saga_sections(
            sagas, app_id, bound.commands_topic, partitions, code_digest
        )
        reacting = sorted([*reacting, *forwarders], key=lambda r: r["name"])
        for forwarder in forwarders:
            internal.append(
                {
                    "name": forwarder["changelog"],
                    "role": "changelog",
                    "reaction": forwarder["name"],
                    "partitions": partitions,
                    "compacted": True,
                }
            )
        internal += saga_topics
    topology = {
        "format": FORMAT,
        "app_id": app_id,
        "partitions": partitions,
        "replication_factor": replication_factor,
        "input_topics": [
            {
                "name": bound.commands_topic,
                "role": "commands",
                "partitions": partitions,
                "key": dict(key),
                "value": {"serde": VALUE_SERDE, "schema": declared["commands"]},
            }
        ],
        "output_topics": [
            {
                "name": bound.events_topic,
                "role": "events",
                "partitions": partitions,
                "key": dict(key),
                "value": {"serde": VALUE_SERDE, "schema": declared["events"]},
            },
            {
                "name": bound.rejections_topic,
                "role": "rejections",
                "partitions": partitions,
                "key": dict(key),
                "value": {"serde": VALUE_SERDE, "schema": None},
            },
        ],
        "stores": [
            {
                "name": aggregate.name,
                "kind": "aggregate",
                "changelog": bound.changelog_topic,
                "partitions": partitions,
                "key": dict(key),
                "value": {"serde": STORE_VALUE_SERDE, "schema": declared["state"]},
            }
        ],
        "handlers": [
            {
                "store": aggregate.name,
                "decide": _handler_names(aggregate.decide),
                "apply": _handler_names(aggregate.apply),
                "parse": _handler_names(aggregate.parse),
                "code": code_digest(
                    aggregate.decide,
                    aggregate.apply,
                    aggregate.parse,
                    named=_evolution_functions(aggregate),
                ),
            }
        ],
        "messages": messages_section(aggregate),
        "internal_topics": internal,
        "projections": projected,
    }
    if reacting:
        topology["reactions"] = reacting
    if saga_list:
        topology["sagas"] = saga_list
    return topology


def topology_of(service: Service | ResolvedService) -> dict[str, Any]:
    """The topology of a service as it would run with the current ENHYDRA_* environment.

    A Service is resolved with the installed plugins first.
    """
    resolved = service if isinstance(service, ResolvedService) else service.resolved()
    s = resolved.settings
    topology = build_topology(
        s.app_id,
        resolved.aggregate,
        partitions=s.partitions,
        replication_factor=s.replication_factor,
        dlq_topic=s.dlq_topic if resolved.policies.uses_dlq() else None,
        projections=list(resolved.projections),
        schemas=resolved.schemas,
        commands_topic=resolved.bound.commands_topic,
        reactions=resolved.reactions,
        sagas=resolved.sagas,
    )
    return {"format": topology.pop("format"), "fingerprint": fingerprint(topology), **topology}


def validate(raw: Any, source: str) -> dict[str, Any]:
    """Check a topology read from a file has the shape `build_topology` writes."""
    if not isinstance(raw, dict):
        raise TopologyError(f"{source}: a topology must be a JSON object")
    if raw.get("format") != FORMAT:
        raise TopologyError(
            f"{source}: format {raw.get('format')!r} is not {FORMAT!r} "
            "(write it with `enhydra topology show`)"
        )
    required = {
        "app_id": str,
        "partitions": int,
        "input_topics": list,
        "output_topics": list,
        "stores": list,
        "handlers": list,
        "internal_topics": list,
        "projections": list,
    }
    for name, kind in required.items():
        if not isinstance(raw.get(name), kind):
            raise TopologyError(f"{source}: {name!r} is missing or not a {kind.__name__}")
    if not isinstance(raw.get("deployed", True), bool):
        raise TopologyError(f"{source}: 'deployed' must be true or false")
    for section in ("input_topics", "output_topics", "stores", "internal_topics", "projections"):
        for item in raw[section]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise TopologyError(f"{source}: every entry of {section!r} needs a 'name'")
    if "messages" in raw:
        _validate_messages(raw["messages"], f"{source}: messages")
    return raw


def _versions_ok(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 1 for v in value)


def _validate_messages(messages: Any, where: str) -> None:
    """The `messages` section has the shape messages_section (and the baseline) write."""
    if not isinstance(messages, dict):
        raise TopologyError(f"{where}: must be a JSON object")
    for section in ("commands", "events", "retired_events"):
        if not isinstance(messages.get(section, {}), dict):
            raise TopologyError(f"{where}: {section!r} must be an object of type name -> entry")
    for section in ("events", "retired_events"):
        for name, event in messages.get(section, {}).items():
            at = f"{where}.{section}.{name}"
            if not isinstance(event, dict):
                raise TopologyError(f"{at}: must be an object")
            if type(event.get("version", 1)) is not int or event.get("version", 1) < 1:
                raise TopologyError(f"{at}: 'version' must be a whole number from 1")
            schemas = event.get("schemas", {})
            if not isinstance(schemas, dict) or not all(k.isdigit() for k in schemas):
                raise TopologyError(f"{at}: 'schemas' must map versions ('1', '2'...) to schemas")
            for key in ("upcasters", "versions"):
                if not _versions_ok(event.get(key, [])):
                    raise TopologyError(f"{at}: {key!r} must be a list of versions")
    state = messages.get("state", {})
    if not isinstance(state, dict) or type(state.get("version", 1)) is not int:
        raise TopologyError(f"{where}.state: must be an object with a whole-number 'version'")
