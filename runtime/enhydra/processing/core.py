"""The pure heart of processing: a batch of command records in, outputs and state changes out.

No I/O here. The Kafka engine and the in-memory test driver both call `process_batch`, so what
a unit test sees is what production does.

Each stored value is an `Entry`: the user's state plus two bookkeeping fields that make state
effectively-once under at-least-once delivery:
- `offset`: the input offset of the last command that changed this key. A redelivered command
  with an offset at or below it is already reflected in the state and is skipped.
- `command_ids`: the ids of the last N accepted commands of this key, so a client retry with the
  same command id is rejected as a duplicate instead of applied twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from enhydra.aggregate import Aggregate, Event, Rejection, State


@dataclass(slots=True)
class Entry:
    state: State
    offset: int = -1
    command_ids: list[str] = field(default_factory=list)


def encode_entry(entry: Entry) -> bytes:
    return orjson.dumps((entry.offset, entry.command_ids, entry.state))


def decode_entry(data: bytes) -> Entry:
    offset, command_ids, state = orjson.loads(data)
    return Entry(state=state, offset=offset, command_ids=command_ids)


@dataclass(slots=True)
class InputRecord:
    """The part of a Kafka record that processing needs."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0


@dataclass(slots=True)
class EmittedEvents:
    key: str
    command_id: str
    offset: int
    events: list[Event]


@dataclass(slots=True)
class Rejected:
    key: str | None
    command_id: str | None
    offset: int
    reason: str
    command: Any

    def to_value(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "key": self.key,
            "reason": self.reason,
            "offset": self.offset,
            "command": self.command,
        }


@dataclass(slots=True)
class BatchResult:
    emitted: list[EmittedEvents] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    changed: dict[str, Entry] = field(default_factory=dict)
    skipped: int = 0
    last_offset: int = -1

    @property
    def event_count(self) -> int:
        return sum(len(e.events) for e in self.emitted)


class InvalidCommand(ValueError):
    """The record cannot be read as a command at all (not JSON, no key, no command id)."""


def parse_command(record: InputRecord, id_field: str) -> tuple[str, str, dict[str, Any]]:
    """Return (key, command id, command) or raise InvalidCommand with a readable reason."""
    if record.key is None:
        raise InvalidCommand("record has no key (commands must be keyed by aggregate id)")
    try:
        key = record.key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidCommand("record key is not UTF-8 text") from None
    if record.value is None:
        raise InvalidCommand("record has no value")
    try:
        command = orjson.loads(record.value)
    except orjson.JSONDecodeError as exc:
        raise InvalidCommand(f"value is not valid JSON: {exc}") from None
    if not isinstance(command, dict):
        raise InvalidCommand("command must be a JSON object")
    command_id = command.get(id_field)
    if not isinstance(command_id, str) or not command_id:
        raise InvalidCommand(f"command has no {id_field!r} (a non-empty string)")
    return key, command_id, command


def _raw_command(record: InputRecord) -> Any:
    if record.value is None:
        return None
    try:
        return orjson.loads(record.value)
    except orjson.JSONDecodeError:
        return record.value.decode("utf-8", "replace")


def process_batch(
    aggregate: Aggregate,
    records: Iterable[InputRecord],
    load: Callable[[str], Entry | None],
    *,
    dedup_window: int = 100,
) -> BatchResult:
    """Run decide/apply over one partition's records in offset order.

    `load` reads a key's entry as of before this batch; keys changed earlier in the batch are
    served from the batch itself, so one key may be updated many times per batch.
    """
    result = BatchResult()
    changed = result.changed
    decide = aggregate.decide
    apply = aggregate.apply
    id_field = aggregate.command_id_field
    for record in records:
        result.last_offset = record.offset
        try:
            key, command_id, command = parse_command(record, id_field)
        except InvalidCommand as exc:
            key = record.key.decode("utf-8", "replace") if record.key is not None else None
            result.rejected.append(
                Rejected(key, None, record.offset, f"invalid command: {exc}", _raw_command(record))
            )
            continue
        entry = changed.get(key)
        if entry is None:
            entry = load(key)
        if entry is not None and record.offset <= entry.offset:
            result.skipped += 1  # redelivered; its effect is already in the state
            continue
        if entry is not None and command_id in entry.command_ids:
            result.rejected.append(
                Rejected(key, command_id, record.offset, "duplicate command_id", command)
            )
            continue
        state = entry.state if entry is not None else aggregate.initial_state
        try:
            events = list(decide(state, command))
        except Rejection as rejection:
            result.rejected.append(
                Rejected(key, command_id, record.offset, rejection.reason, command)
            )
            continue
        if not events:
            continue
        for event in events:
            state = apply(state, event)
        ids = entry.command_ids if entry is not None else []
        if dedup_window:
            ids = [*ids[-(dedup_window - 1) :], command_id] if dedup_window > 1 else [command_id]
        changed[key] = Entry(state=state, offset=record.offset, command_ids=ids)
        result.emitted.append(EmittedEvents(key, command_id, record.offset, events))
    return result
