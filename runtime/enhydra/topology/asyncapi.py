"""A service's AsyncAPI 3 document: its topics, messages and headers, for the teams around it.

Built from the topology (model.py) alone, so the document, `enhydra topology check` and the
running service agree on every topic name, partition count and schema:
- one server per bootstrap address, with the protocol and the SASL / mTLS security scheme of
  the connection settings (their public description: no secret reaches the document);
- one channel per topic, its id and address the topic name: commands, events, rejections and
  the dead-letter queue, with Kafka bindings (topic, partitions, replicas, the key's schema);
- one message per declared command and event type, whose payload is the type's JSON Schema;
  an untyped service gets the service-level schema, or a generic object with a `type`;
- event messages document the runtime's headers, `enhydra.event_version` fixed to the type's
  current version; older versions are listed under `x-enhydra-versions` (the parser accepts
  extensions anywhere, and one message per type keeps a consumer's switch on `type` simple);
- operations: the service receives commands and sends events, rejections and dead letters;
  each projection receives the events in its own consumer group; each reaction receives an
  upstream service's events (a channel of its own, with the types it reads) in its group and
  sends commands to this service's or another service's commands topic.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from enhydra.contracts.fingerprint import canonical_json
from enhydra.contracts.headers import (
    COMMAND_ID_HEADER,
    COMMAND_OFFSET_HEADER,
    EVENT_INDEX_HEADER,
    EVENT_VERSION_HEADER,
)
from enhydra.errors.dlq import PREFIX as DLQ_PREFIX
from enhydra.errors.dlq import REPLAYS as DLQ_REPLAYS
from enhydra.errors.failure import Stage

if TYPE_CHECKING:
    from enhydra.service import Service
    from enhydra.settings import Connection
    from enhydra.spec import ResolvedService

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING_VERSION = "0.5.0"
JSON = "application/json"

# SASL mechanism (ENHYDRA_SASL_MECHANISM) -> AsyncAPI security scheme type.
SASL_SCHEMES = {
    "PLAIN": "plain",
    "SCRAM-SHA-256": "scramSha256",
    "SCRAM-SHA-512": "scramSha512",
    "OAUTHBEARER": "oauth2",
}
SECURE_PROTOCOLS = ("SSL", "SASL_SSL")

# The headers every dead letter gets (errors/dlq.py writes them; a unit test holds the two
# together), each with what it tells the reader.
DLQ_HEADERS = {
    "topic": "the topic the record came from",
    "partition": "its partition",
    "offset": "its offset there",
    "timestamp": "its timestamp (ms since the epoch)",
    "error.class": "the error's class",
    "error.message": "the error's message (bounded)",
    "error.stacktrace": "the stack trace (bounded)",
    "stage": "where it failed: " + ", ".join(Stage),
    "app": "the application id",
    "instance": "the instance that dead-lettered it",
    "attempts": "how many times it was tried",
    "failed_at": "when it failed (ISO 8601, UTC)",
}

REJECTION_SCHEMA = {
    "type": "object",
    "description": "a command that decide refused, with the reason it gave",
    "required": ["command_id", "key", "reason", "offset", "command"],
    "properties": {
        "command_id": {"type": ["string", "null"], "description": "the command's command_id"},
        "key": {"type": ["string", "null"], "description": "the aggregate key"},
        "reason": {"type": "string", "description": "the Rejection's message"},
        "offset": {"type": "integer", "description": "the command's offset in its partition"},
        "command": {"description": "the command as it was received"},
    },
}


def _generic(role: str, name: str | None = None) -> dict[str, Any]:
    """The payload of an untyped message: a JSON object with its `type`."""
    kind: dict[str, Any] = {"type": "string", "description": f"the {role} type"}
    if name is not None:
        kind = {"const": name}
    return {"type": "object", "required": ["type"], "properties": {"type": kind}}


def _digits(description: str, enum: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "pattern": "^[0-9]+$", "description": description}
    if enum is not None:
        schema["enum"] = enum
    return schema


def event_headers_schema(version: int) -> dict[str, Any]:
    """The headers of an event of a type at `version` (contracts/headers.py), as a schema."""
    return {
        "type": "object",
        "required": [
            COMMAND_ID_HEADER,
            COMMAND_OFFSET_HEADER,
            EVENT_INDEX_HEADER,
            EVENT_VERSION_HEADER,
        ],
        "properties": {
            COMMAND_ID_HEADER: {
                "type": "string",
                "description": "the command that caused the event (deduplication on rebuilds)",
            },
            COMMAND_OFFSET_HEADER: _digits(
                "the command's offset in the commands partition of the same number"
            ),
            EVENT_INDEX_HEADER: _digits("the event's position among its command's events"),
            EVENT_VERSION_HEADER: _digits(
                f"the version of the event's shape: {version} when written by this code; "
                "older events carry older versions (none means 1) and are upcast before apply",
                [str(version)],
            ),
        },
    }


def dead_letter_headers_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {
        DLQ_PREFIX + name: {"type": "string", "description": text}
        for name, text in DLQ_HEADERS.items()
    }
    properties[DLQ_PREFIX + "stage"]["enum"] = [str(stage) for stage in Stage]
    properties[DLQ_REPLAYS] = _digits("how many times it was replayed from the DLQ (if ever)")
    return {
        "type": "object",
        "description": "the original record's headers, plus where and why it failed",
        "required": [DLQ_PREFIX + name for name in DLQ_HEADERS],
        "properties": properties,
    }


class _Schemas:
    """Hoists the `$defs` of payload schemas into components.schemas: the parser resolves
    every `$ref` against the whole document, not against the schema it sits in."""

    def __init__(self) -> None:
        self.shared: dict[str, Any] = {}

    def payload(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        schema = copy.deepcopy(dict(schema))
        renamed: dict[str, str] = {}
        for section in ("$defs", "definitions"):
            for name, sub in (schema.pop(section, None) or {}).items():
                key, n = _component_key(name), 1
                while key in self.shared and self.shared[key] != sub:
                    n += 1
                    key = f"{_component_key(name)}_{n}"
                renamed[f"#/{section}/{name}"] = f"#/components/schemas/{key}"
                self.shared[key] = sub
        if renamed:
            for key in list(self.shared):
                self.shared[key] = _rewrite(self.shared[key], renamed)
            schema = _rewrite(schema, renamed)
        return schema


def _component_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "_"


def _rewrite(node: Any, refs: Mapping[str, str]) -> Any:
    if isinstance(node, dict):
        return {
            k: (refs.get(v, v) if k == "$ref" and isinstance(v, str) else _rewrite(v, refs))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v, refs) for v in node]
    return node


def _operation_id(*words: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "_", w).strip("_") for w in words if w)


def _servers(connection: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Servers and security schemes from a Connection's public description (describe())."""
    protocol = str(connection.get("security_protocol", "PLAINTEXT"))
    mechanism = str(connection.get("sasl_mechanism", ""))
    schemes: dict[str, Any] = {}
    if protocol.startswith("SASL_") and mechanism in SASL_SCHEMES:
        key = "sasl-" + mechanism.lower()
        scheme: dict[str, Any] = {"type": SASL_SCHEMES[mechanism]}
        if mechanism == "OAUTHBEARER":
            scheme["flows"] = {}
            scheme["description"] = (
                "SASL/OAUTHBEARER: tokens from ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER"
            )
        else:
            scheme["description"] = (
                f"SASL/{mechanism}: ENHYDRA_SASL_USERNAME and ENHYDRA_SASL_PASSWORD "
                "(or ENHYDRA_SASL_PASSWORD_FILE)"
            )
        schemes[key] = scheme
    elif protocol == "SSL" and connection.get("ssl_certfile"):
        schemes["mtls"] = {
            "type": "X509",
            "description": "mutual TLS: ENHYDRA_SSL_CERTFILE and ENHYDRA_SSL_KEYFILE",
        }
    tls = " over TLS (ENHYDRA_SSL_CAFILE)" if protocol in SECURE_PROTOCOLS else ""
    text = f"Kafka, ENHYDRA_SECURITY_PROTOCOL={protocol}{tls}"
    hosts = [h.strip() for h in str(connection.get("bootstrap", "")).split(",") if h.strip()]
    servers: dict[str, Any] = {}
    for n, host in enumerate(hosts or ["127.0.0.1:9092"], start=1):
        server: dict[str, Any] = {
            "host": host,
            "protocol": "kafka-secure" if protocol in SECURE_PROTOCOLS else "kafka",
            "description": f"{text}; a bootstrap server (ENHYDRA_BOOTSTRAP_SERVERS)",
        }
        if schemes:
            server["security"] = [{"$ref": f"#/components/securitySchemes/{k}"} for k in schemes]
        servers["kafka" if n == 1 else f"kafka-{n}"] = server
    return servers, schemes


def _channel(
    topic: Mapping[str, Any], replicas: int | None, messages: dict[str, Any], text: str
) -> Any:
    kafka = {"topic": topic["name"], "partitions": topic["partitions"]}
    if replicas is not None:  # unset: the cluster's default, not known to the document
        kafka["replicas"] = replicas
    return {
        "address": topic["name"],
        "description": text,
        "messages": messages,
        "bindings": {"kafka": {**kafka, "bindingVersion": KAFKA_BINDING_VERSION}},
    }


def _message(
    name: str,
    summary: str,
    payload: Any,
    key: Mapping[str, Any],
    *,
    headers: Any = None,
    content_type: str = JSON,
    **extensions: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": name,
        "title": name,
        "summary": summary,
        "contentType": content_type,
    }
    if headers is not None:
        message["headers"] = headers
    message["payload"] = payload
    message["bindings"] = {"kafka": {"key": dict(key), "bindingVersion": KAFKA_BINDING_VERSION}}
    message.update({f"x-enhydra-{k.replace('_', '-')}": v for k, v in extensions.items()})
    return message


def _operation(action: str, channel: str, messages: dict[str, Any], text: str, group: str | None):
    operation: dict[str, Any] = {
        "action": action,
        "channel": {"$ref": f"#/channels/{channel}"},
        "summary": text,
        "messages": [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in messages],
    }
    if group is not None:
        operation["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "enum": [group]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        }
    return operation


def _versions(event: Mapping[str, Any], schemas: _Schemas) -> dict[str, Any]:
    """Every version before the current one: whether an upcaster lifts it, its schema if known."""
    current = int(event.get("version", 1))
    known = event.get("schemas") or {}
    upcasters = set(event.get("upcasters") or ())
    out: dict[str, Any] = {}
    for version in range(1, current):
        entry: dict[str, Any] = {"upcaster": version in upcasters}
        if entry["upcaster"]:
            entry["upcastTo"] = version + 1
        if str(version) in known:
            entry["payload"] = schemas.payload(known[str(version)])
        out[str(version)] = entry
    return out


def _merge_baseline(events: dict[str, Any], baseline: Mapping[str, Any] | None) -> None:
    """Older versions' schemas that only the baseline keeps (it keeps every deployed one)."""
    old = ((baseline or {}).get("messages") or {}).get("events") or {}
    for name, event in events.items():
        for version, schema in ((old.get(name) or {}).get("schemas") or {}).items():
            event.setdefault("schemas", {}).setdefault(str(version), schema)


def build_asyncapi(
    topology: Mapping[str, Any],
    *,
    connection: Mapping[str, Any] | None = None,
    description: str = "",
    baseline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of a topology (pure).

    `connection` is a Connection's `describe()` (addresses, protocol, mechanism: no secrets);
    `baseline` a topology that may hold older event versions' schemas.
    """
    app_id = topology["app_id"]
    replicas = topology.get("replication_factor")
    messages = topology.get("messages") or {}
    commands_topic = topology["input_topics"][0]
    by_role = {t["role"]: t for t in topology["output_topics"]}
    events_topic, rejections_topic = by_role["events"], by_role["rejections"]
    dlq = next((t for t in topology["internal_topics"] if t.get("role") == "dlq"), None)
    key = {
        "type": commands_topic["key"]["type"],
        "description": "the aggregate key, UTF-8; its partition is murmur2(key), as Kafka's "
        "default partitioner",
    }
    schemas = _Schemas()
    servers, security = _servers(connection or {})

    command_messages: dict[str, Any] = {}
    for name, command in (messages.get("commands") or {}).items():
        schema = command.get("schema")  # None: a handler's command declared by name only
        payload = schemas.payload(schema) if schema is not None else _generic("command", name)
        command_messages[name] = _message(name, f"command {name!r}", payload, key)
    if not messages.get("typed") and "command" not in command_messages:
        declared = commands_topic["value"].get("schema")
        payload = schemas.payload(declared) if declared else _generic("command")
        command_messages["command"] = _message("command", "a command (untyped)", payload, key)

    events = copy.deepcopy(dict(messages.get("events") or {}))
    _merge_baseline(events, baseline)
    declared_events = events_topic["value"].get("schema")
    event_messages: dict[str, Any] = {}
    for name, event in events.items():
        version = int(event.get("version", 1))
        schema = (event.get("schemas") or {}).get(str(version))
        if schema is not None:
            payload = schemas.payload(schema)
        elif declared_events:
            payload = {"allOf": [schemas.payload(declared_events), _generic("event", name)]}
        else:
            payload = _generic("event", name)
        extensions: dict[str, Any] = {"event_version": version}
        older = _versions(event, schemas)
        if older:
            extensions["versions"] = older
        event_messages[name] = _message(
            name,
            f"event {name!r}, version {version}",
            payload,
            key,
            headers=event_headers_schema(version),
            **extensions,
        )
    if not messages.get("typed"):  # any other event type: untyped services declare none
        payload = schemas.payload(declared_events) if declared_events else _generic("event")
        other = "event" if "event" not in event_messages else "anyEvent"
        event_messages[other] = _message(
            other, "an event (untyped)", payload, key, headers=event_headers_schema(1)
        )

    rejection = {"rejection": _message("rejection", "a refused command", REJECTION_SCHEMA, key)}
    channels = {
        commands_topic["name"]: _channel(
            commands_topic, replicas, command_messages, "commands, keyed by aggregate key"
        ),
        events_topic["name"]: _channel(
            events_topic, replicas, event_messages, "events: the history, kept forever"
        ),
        rejections_topic["name"]: _channel(
            rejections_topic, replicas, rejection, "commands that decide refused"
        ),
    }
    operations = {
        "receiveCommands": _operation(
            "receive", commands_topic["name"], command_messages, "decide on each command", app_id
        ),
        "sendEvents": _operation(
            "send", events_topic["name"], event_messages, "the events decide returned", None
        ),
        "sendRejections": _operation(
            "send", rejections_topic["name"], rejection, "commands decide refused", None
        ),
    }
    if dlq is not None:
        letter = {
            "deadLetter": _message(
                "deadLetter",
                "a record that could not be processed, as it arrived",
                {"description": "the failed record's value, unchanged (any bytes)"},
                key,
                headers=dead_letter_headers_schema(),
                content_type="application/octet-stream",
            )
        }
        channels[dlq["name"]] = _channel(
            dlq, replicas, letter, "the dead-letter queue (`enhydra dlq list/show/replay`)"
        )
        operations["sendDeadLetters"] = _operation(
            "send", dlq["name"], letter, "records that failed, with why", None
        )
    for projection in topology.get("projections") or ():
        operations[_operation_id("project", projection["name"])] = _operation(
            "receive",
            projection["source"],
            event_messages,
            f"projection {projection['name']!r} folds the events into its read model",
            projection["group"],
        )

    _reaction_operations(topology, channels, operations, schemas, replicas)
    _saga_operations(topology, channels, operations, replicas)

    info: dict[str, Any] = {
        "title": app_id,
        "version": "0",  # the contract's digest, set below
        "description": description
        or f"The Kafka contract of the Enhydra service {app_id!r}: what it reads and writes.",
    }
    if topology.get("fingerprint"):
        info["x-enhydra-fingerprint"] = topology["fingerprint"]
    components: dict[str, Any] = {}
    if schemas.shared:
        components["schemas"] = dict(sorted(schemas.shared.items()))
    if security:
        components["securitySchemes"] = security
    document: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "id": f"urn:enhydra:{app_id}",
        "info": info,
        "defaultContentType": JSON,
        "servers": servers,
        "channels": channels,
        "operations": operations,
    }
    if components:
        document["components"] = components
    # The version of the contract itself: it changes with a topic, a message or a schema, not
    # with handler logic or the servers of one environment (so a committed copy stays right).
    contract = {
        "channels": channels,
        "operations": operations,
        "schemas": components.get("schemas"),
    }
    info["version"] = "sha256:" + hashlib.sha256(canonical_json(contract)).hexdigest()[:16]
    return document


def _commands_channel(
    channels: dict[str, Any],
    target: str,
    partitions: int,
    replicas: int | None,
    key: Mapping[str, Any],
) -> dict[str, Any]:
    """The messages of the commands channel `target`; another service's is added, generic."""
    if target not in channels:
        command = {"command": _message("command", "a command", _generic("command"), key)}
        channels[target] = _channel(
            {"name": target, "partitions": partitions},
            replicas,
            command,
            "another service's commands",
        )
    return channels[target]["messages"]


def _reaction_operations(
    topology: Mapping[str, Any],
    channels: dict[str, Any],
    operations: dict[str, Any],
    schemas: _Schemas,
    replicas: int | None,
) -> None:
    """The upstream channels reactions receive from, and the commands topics they send to."""
    key = {"type": "string", "description": "the upstream's aggregate key, UTF-8"}
    for reaction in topology.get("reactions") or ():
        source, topic = reaction["source"], reaction["input"]
        reads = reaction.get("reads") or {}
        messages = {
            name: _message(
                name,
                f"{source}'s event {name!r}, as reaction {reaction['name']!r} reads it",
                schemas.payload(schema) if schema is not None else _generic("event", name),
                key,
            )
            for name, schema in reads.items()
        } or {"event": _message("event", f"any event of {source}", _generic("event"), key)}
        if reaction.get("saga") and not reads and topic in channels:
            # a saga reading this service's own events: the channel already lists them all
            messages = channels[topic]["messages"]
        channel = channels.setdefault(
            topic,
            _channel(
                {"name": topic, "partitions": reaction["partitions"]},
                None,
                {},
                f"{source}'s events (another service's topic)",
            ),
        )
        channel["messages"].update(messages)
        saga = reaction.get("saga")
        operations[_operation_id("react", reaction["name"])] = _operation(
            "receive",
            topic,
            messages,
            f"saga {saga!r} reads {source}'s events (re-keyed by correlation id into its inbox)"
            if saga
            else f"reaction {reaction['name']!r} turns {source}'s events into commands",
            reaction["group"],
        )
        if saga:
            continue  # it writes to the saga's inbox, an internal topic
        for target in reaction.get("sends") or ():
            sent = _commands_channel(channels, target, reaction["partitions"], replicas, key)
            operations[_operation_id("react", reaction["name"], "send", target)] = _operation(
                "send",
                target,
                sent,
                f"commands made by reaction {reaction['name']!r}",
                None,
            )


def _saga_operations(
    topology: Mapping[str, Any],
    channels: dict[str, Any],
    operations: dict[str, Any],
    replicas: int | None,
) -> None:
    """The commands topics sagas send to (their receive operations are their forwarders')."""
    key = {"type": "string", "description": "the receiving aggregate's key, UTF-8"}
    for saga in topology.get("sagas") or ():
        for target in saga.get("sends") or ():
            sent = _commands_channel(channels, target, saga["partitions"], replicas, key)
            operations[_operation_id("saga", saga["name"], "send", target)] = _operation(
                "send",
                target,
                sent,
                f"commands of saga {saga['name']!r}, made by its events and deadlines",
                None,
            )


def asyncapi_of(
    service: Service | ResolvedService,
    *,
    connection: Connection | None = None,
    baseline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The AsyncAPI document of a service as it would run with the current ENHYDRA_* settings
    (`connection`, when given, names other Kafka servers than the service's settings)."""
    from enhydra.spec import ResolvedService
    from enhydra.topology.model import topology_of

    resolved = service if isinstance(service, ResolvedService) else service.resolved()
    return build_asyncapi(
        topology_of(resolved),
        connection=(connection or resolved.settings.connection).describe(),
        description=resolved.aggregate.description,
        baseline=baseline,
    )
