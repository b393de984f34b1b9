"""An in-memory driver: feed commands to an aggregate, see events, rejections and state.

Like Kafka Streams' TopologyTestDriver, it runs the very batch core the Kafka engine runs
(`process_batch`), so dedup, rejections and state are the same, without a broker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from enhydra.aggregate import Aggregate, Command, Event, State
from enhydra.contracts.codec import Entry
from enhydra.errors.failure import Failure
from enhydra.processing.core import InputRecord, process_batch
from enhydra.service import Service


@dataclass
class Outcome:
    """What one command produced."""

    events: list[Event] = field(default_factory=list)
    rejection: str | None = None
    failure: Failure | None = None  # what the service's error policies would handle

    @property
    def accepted(self) -> bool:
        return self.rejection is None and self.failure is None


class Driver:
    """Processes commands synchronously, one partition, offsets counting from 0."""

    def __init__(self, target: Aggregate | Service, *, dedup_window: int = 100) -> None:
        self.aggregate = target.aggregate if isinstance(target, Service) else target
        self.dedup_window = dedup_window
        self.entries: dict[str, Entry] = {}
        self.events: list[tuple[str, Event]] = []
        self.rejections: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self._offset = 0

    def send(self, key: str, command: Command | bytes) -> Outcome:
        """Process one command keyed by `key` (bytes are sent as-is, e.g. invalid JSON)."""
        return self.send_many([(key, command)])[0]

    def send_many(self, commands: Iterable[tuple[str, Command | bytes]]) -> list[Outcome]:
        """Process commands as one batch, the way the engine sees a fetched batch."""
        records = []
        for key, command in commands:
            value = command if isinstance(command, bytes) else orjson.dumps(command)
            records.append(InputRecord(self._offset, key.encode("utf-8"), value))
            self._offset += 1
        result = process_batch(
            self.aggregate, records, self.entries.get, dedup_window=self.dedup_window
        )
        self.entries.update(result.changed)
        outcomes = {r.offset: Outcome() for r in records}
        for emitted in result.emitted:
            outcomes[emitted.offset].events.extend(emitted.events)
            self.events.extend((emitted.key, e) for e in emitted.events)
        for rejected in result.rejected:
            outcomes[rejected.offset].rejection = rejected.reason
            self.rejections.append(rejected.to_value())
        for failure in result.failures:
            outcomes[failure.record.offset].failure = failure
            self.failures.append(failure)
        return [outcomes[r.offset] for r in records]

    def state(self, key: str) -> State:
        entry = self.entries.get(key)
        return entry.state if entry is not None else None

    def stored_keys(self) -> list[str]:
        return sorted(self.entries)
