"""The stored entry: what a changelog record, a RocksDB value and a snapshot row hold.

An entry is the user's state plus two fields that make state effectively-once under
at-least-once delivery:
- `offset`: the input offset of the last command that changed this key. A redelivered command
  with an offset at or below it is already reflected in the state and is skipped.
- `command_ids`: the ids of the last N accepted commands of this key, so a client retry with the
  same command id is rejected as a duplicate instead of applied twice.

A state written by code whose `state_version` is above 1 carries that version as a fourth
element, `[offset, [ids], state, version]`; without it the version is 1, so entries written
before state versions existed read as they always did.

The live engine, the changelog, snapshots and the Spark fold all read and write these bytes.
JSON is written by orjson; a typed value (a msgspec Struct, messages.py) is turned into
builtins by `to_builtins` only when orjson meets one, so untyped values pay nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class Entry:
    state: Any
    offset: int = -1
    command_ids: list[str] = field(default_factory=list)
    version: int = 1  # the state's version (Aggregate.state_version of the code that wrote it)


def to_builtins(value: Any) -> Any:
    """orjson's fallback for values it does not know: typed declarations (msgspec Structs)."""
    if hasattr(type(value), "__struct_config__"):
        import msgspec  # only services with typed declarations need it (not Spark executors)

        return msgspec.to_builtins(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def encode_json(value: Any) -> bytes:
    """JSON of a command, event, rejection or state, typed or not."""
    return orjson.dumps(value, default=to_builtins)


def encode_entry(entry: Entry) -> bytes:
    if entry.version == 1:
        return orjson.dumps((entry.offset, entry.command_ids, entry.state), default=to_builtins)
    return orjson.dumps(
        (entry.offset, entry.command_ids, entry.state, entry.version), default=to_builtins
    )


def decode_entry(data: bytes) -> Entry:
    fields = orjson.loads(data)
    if len(fields) == 3:
        offset, command_ids, state = fields
        return Entry(state=state, offset=offset, command_ids=command_ids)
    offset, command_ids, state, version = fields
    if type(version) is not int:
        raise ValueError(f"state version {version!r} is not a whole number")
    return Entry(state=state, offset=offset, command_ids=command_ids, version=version)
