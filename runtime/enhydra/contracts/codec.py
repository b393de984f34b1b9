"""The stored entry: what a changelog record, a RocksDB value and a snapshot row hold.

An entry is the user's state plus two fields that make state effectively-once under
at-least-once delivery:
- `offset`: the input offset of the last command that changed this key. A redelivered command
  with an offset at or below it is already reflected in the state and is skipped.
- `command_ids`: the ids of the last N accepted commands of this key, so a client retry with the
  same command id is rejected as a duplicate instead of applied twice.

The live engine, the changelog, snapshots and the Spark fold all read and write these bytes.
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


def encode_entry(entry: Entry) -> bytes:
    return orjson.dumps((entry.offset, entry.command_ids, entry.state))


def decode_entry(data: bytes) -> Entry:
    offset, command_ids, state = orjson.loads(data)
    return Entry(state=state, offset=offset, command_ids=command_ids)
