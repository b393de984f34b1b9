"""Reactions: another service's events turned into commands, one pure function per reaction.

    react(upstream) -> list[Emit]      upstream: an event with its key, position and headers

A reaction reads an upstream service's events topic in its own consumer group
(`<app>-reaction-<name>`) and writes commands: to this service's commands topic, or to another
service's. Each command's id is derived from the upstream event's position, so an event read
twice (a crash before the offsets were committed) writes the same command again, and the
aggregate that receives it skips the copy by its id (`dedup_window`, processing/core.py).

The position is the event's place in its key's history when an Enhydra service published it:
(events topic, partition, `enhydra.command_offset`, `enhydra.event_index`). The upstream
service may publish an event again at a new offset (it crashed between publishing and writing
its changelog); the copy has the same source, so the same command id, and is skipped too. A
record without those headers (another producer) is placed by its own offset.

Everything here is pure: the Kafka step (engine.py), the Driver and unit tests run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from enhydra.contracts.headers import EVENT_VERSION_HEADER, event_source
from enhydra.contracts.partitioner import partition_for
from enhydra.contracts.sizes import record_size
from enhydra.errors.failure import Failure, Stage
from enhydra.evolution import TYPE_FIELD
from enhydra.messages import tag_of

__all__ = [
    "Emit",
    "ReactResult",
    "Reaction",
    "Upstream",
    "command_id",
    "react_batch",
]


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream event as a reaction sees it: the event and where it sits."""

    key: str | None
    event: Any  # a dict, or the declared Struct of its type when the reaction `reads` types
    topic: str
    partition: int
    offset: int  # the record's offset in the events topic
    index: int  # its index among the events of the command that caused it (0 if unknown)
    headers: Mapping[str, bytes] = field(default_factory=dict)
    # (command offset, event index) upstream, or None when not published by an Enhydra service
    source: tuple[int, int] | None = None

    @property
    def position(self) -> tuple[str, int, int, int]:
        """(topic, partition, offset, index): the same for every copy of this event."""
        if self.source is not None:
            return (self.topic, self.partition, *self.source)
        return (self.topic, self.partition, self.offset, self.index)

    @property
    def type(self) -> str | None:
        """The event's type name (its "type" field, or its Struct's tag)."""
        if isinstance(self.event, dict):
            kind = self.event.get(TYPE_FIELD)
            return kind if isinstance(kind, str) else None
        return tag_of(type(self.event))


@dataclass(frozen=True, slots=True)
class Emit:
    """A command a reaction writes: keyed like its aggregate, for this service or `topic`."""

    key: str
    command: Any  # a JSON object (dict) or a tagged msgspec Struct
    topic: str | None = None  # another service's commands topic; None: this service's


React = Callable[[Upstream], Iterable[Emit] | None]


@dataclass(frozen=True)
class Reaction:
    """Reacts to `source`'s events (topic `<source>-events` unless `events_topic` says).

    `reads`: the upstream event types this reaction reads, as tagged msgspec Structs; events
    of other types are not given to `react`, and the types are this service's side of the
    contract with the upstream one (`enhydra topology check`). Without `reads` every event is
    given as a dict. `sends_to` lists other services' commands topics it may write to (their
    partition counts are learned at start).
    """

    name: str
    source: str
    react: React
    reads: Sequence[type] = ()
    # Other services' commands topics this reaction writes to (Emit.topic); this service's
    # own commands topic needs no mention.
    sends_to: Sequence[str] = ()
    events_topic: str | None = None
    command_id_field: str = "command_id"
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"reaction name {self.name!r}: use letters, digits, '-' or '_'")
        if not self.source:
            raise ValueError(f"reaction {self.name!r}: name the upstream service in `source`")
        if not callable(self.react):
            raise TypeError(f"reaction {self.name!r}: react must be a callable")
        object.__setattr__(self, "reads", tuple(self.reads))
        object.__setattr__(self, "sends_to", tuple(self.sends_to))
        tags = [tag_of(cls) for cls in self.reads]  # raises with a hint for a non-Struct
        if len(set(tags)) != len(tags):
            raise ValueError(f"reaction {self.name!r}: an event type is read twice: {tags}")

    @property
    def upstream_topic(self) -> str:
        return self.events_topic or f"{self.source}-events"

    def group_id(self, app_id: str) -> str:
        return f"{app_id}-reaction-{self.name}"

    def changelog_topic(self, app_id: str) -> str:
        """The task runner's changelog; a reaction keeps no state, so it stays empty."""
        return f"{app_id}-{self.name}-changelog"

    def reads_by_type(self) -> dict[str, type]:
        return {tag_of(cls): cls for cls in self.reads}


def command_id(reaction: str, position: tuple[str, int, int, int], n: int) -> str:
    """The id of the `n`th command `reaction` writes for the event at `position`."""
    topic, partition, offset, index = position
    return f"{reaction}:{topic}:{partition}:{offset}:{index}:{n}"


class NotAnEvent(ValueError):
    """An upstream record a reaction cannot read: no JSON object, or not its declared type."""


Headers = list[tuple[str, bytes]]


@dataclass(slots=True)
class ReactResult:
    """What a batch of upstream records made: command records per (topic, partition)."""

    outputs: dict[tuple[str, int], list[tuple[bytes, bytes, Headers | None]]] = field(
        default_factory=dict
    )
    failures: list[Failure] = field(default_factory=list)
    commands: int = 0
    ignored: int = 0  # events of types the reaction does not read
    last_offset: int = -1
    # A transient error stopped the batch at this record: (offset, error), retried later.
    interrupted: tuple[int, BaseException] | None = None


def _headers(raw: Iterable[tuple[str, bytes]] | None) -> dict[str, bytes]:
    return {name: value for name, value in raw or ()}


def read_event(reaction: Reaction, value: bytes | None, types: Mapping[str, type]) -> Any:
    """The event a record holds, typed when the reaction reads types; None: not read here."""
    if value is None:
        raise NotAnEvent("record has no value")
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise NotAnEvent(f"value is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise NotAnEvent("event must be a JSON object")
    if not types:
        return event
    cls = types.get(event.get(TYPE_FIELD))
    if cls is None:
        return None
    try:
        return msgspec.convert(event, cls)
    except msgspec.ValidationError as exc:
        raise NotAnEvent(f"{reaction.source} event {tag_of(cls)!r}: {exc}") from None


def encode_command(emit: Emit, id_field: str, command_id_: str) -> bytes:
    """The command's JSON with its derived id (replacing any id the reaction set)."""
    command = emit.command
    if isinstance(command, msgspec.Struct):
        command = msgspec.to_builtins(command)
    if not isinstance(command, dict):
        raise TypeError(
            f"a command must be a dict or a tagged msgspec Struct, got {type(command).__name__}"
        )
    return orjson.dumps({**command, id_field: command_id_})


def react_batch(
    reaction: Reaction,
    records: Iterable[Any],
    *,
    topic: str,
    partition: int,
    commands_topic: str,
    partitions_of: Callable[[str], int],
    transient: tuple[type[BaseException], ...] = (),
    give_up: Mapping[int, int] | None = None,
    max_record_bytes: int = 1_000_000,
    trace: Callable[[Any], Headers | None] | None = None,
) -> ReactResult:
    """Run `reaction` over one upstream partition's records in offset order.

    `records` have offset, key, value and headers (aiokafka's ConsumerRecords or look-alikes).
    A record that cannot be read is a DESERIALIZE failure, an error in `react` or a command
    that cannot be written a PROCESS or PRODUCE failure: each writes nothing and goes to the
    error policies. An error of a `transient` type stops the batch at its record so it is
    retried, unless its offset is in `give_up`. Commands go to the partition Kafka's default
    partitioner gives their key among `partitions_of(topic)`. `trace` (tracing on) gives the
    headers that carry an upstream record's trace context on to the commands it made.
    """
    give_up = give_up or {}
    types = reaction.reads_by_type()
    result = ReactResult()
    outputs = result.outputs
    for record in records:
        offset = record.offset
        result.last_offset = offset
        key = record.key.decode("utf-8", "replace") if record.key else None
        try:
            event = read_event(reaction, record.value, types)
        except NotAnEvent as exc:
            result.failures.append(Failure(record, Stage.DESERIALIZE, exc, key))
            continue
        if event is None:
            result.ignored += 1
            continue
        headers = _headers(record.headers)
        source = event_source(record.headers)
        upstream = Upstream(
            key,
            event,
            topic,
            partition,
            offset,
            source[1] if source is not None else 0,
            headers,
            source,
        )
        try:
            emitted = list(reaction.react(upstream) or ())
        except Exception as exc:
            if isinstance(exc, transient) and offset not in give_up:
                result.interrupted = (offset, exc)
                result.last_offset = offset - 1
                break
            attempts = give_up.get(offset, 0) + 1
            result.failures.append(Failure(record, Stage.PROCESS, exc, key, attempts))
            continue
        headers = trace(record) if trace is not None and emitted else None
        try:
            made = []
            for n, emit in enumerate(emitted):
                if not isinstance(emit, Emit):
                    raise TypeError(f"react must return Emit(...)s, got {type(emit).__name__}")
                target = emit.topic or commands_topic
                raw_key = emit.key.encode("utf-8")
                value = encode_command(
                    emit, reaction.command_id_field, command_id(reaction.name, upstream.position, n)
                )
                size = record_size(raw_key, value)
                if size > max_record_bytes:
                    raise ValueError(
                        f"command of {size} bytes exceeds the {max_record_bytes}-byte record limit"
                    )
                place = (target, partition_for(raw_key, partitions_of(target)))
                made.append((place, (raw_key, value, headers)))
        except (TypeError, ValueError) as exc:  # orjson raises TypeError for non-JSON values
            result.failures.append(Failure(record, Stage.PRODUCE, exc, key))
            continue
        for place, out in made:
            outputs.setdefault(place, []).append(out)
        result.commands += len(made)
    return result


def event_version(headers: Mapping[str, bytes]) -> int:
    """The version an upstream event was written at (its enhydra.event_version header)."""
    raw = headers.get(EVENT_VERSION_HEADER)
    return int(raw) if raw else 1
