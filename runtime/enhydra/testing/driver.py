"""An in-memory driver: feed commands to an aggregate, see events, rejections and state.

Like Kafka Streams' TopologyTestDriver, it runs the very batch core the Kafka engine runs
(`process_batch`), so dedup, rejections and state are the same, without a broker. `given`
starts a key from a stored history, old event versions included, upcast like every reader of
the events topic does. `feed` gives a reaction an upstream event (reactions/) and sends the
commands it makes, with the ids derived from the event's position, as the Kafka step does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from enhydra.aggregate import Aggregate, Command, Event, State
from enhydra.contracts.codec import Entry
from enhydra.errors.failure import Failure
from enhydra.evolution import upcast
from enhydra.processing.core import InputRecord, process_batch
from enhydra.reactions.model import Reaction, react_batch
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
        self.reactions = {r.name: r for r in getattr(target, "reactions", ())}
        self.sent: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # other services' commands
        self._upstream: dict[tuple[str, int], int] = {}  # upstream topic-partition -> next offset
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

    def feed(
        self,
        reaction: Reaction | str,
        key: str,
        event: Any,
        *,
        partition: int = 0,
        offset: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> list[Outcome]:
        """Give `reaction` (or the service's reaction of that name) one upstream event.

        The event sits at the next offset of its upstream partition, or at `offset` (the same
        offset again: Kafka redelivering it). The commands for this service are processed like
        `send_many`; those for another service's topic are kept in `sent[topic]`. Returns the
        outcomes of this service's commands; a record the reaction cannot read or that fails in
        `react` raises, as its error policy would see it.
        """
        if isinstance(reaction, str):
            if reaction not in self.reactions:
                known = ", ".join(sorted(self.reactions)) or "none"
                raise KeyError(f"no reaction {reaction!r} (this service's: {known})")
            reaction = self.reactions[reaction]
        place = (reaction.upstream_topic, partition)
        if offset is None:
            offset = self._upstream.get(place, 0)
        self._upstream[place] = max(self._upstream.get(place, 0), offset + 1)
        value = msgspec.json.encode(event)
        record = InputRecord(offset, key.encode("utf-8"), value, headers=tuple(headers))
        mine = "this service's commands"
        result = react_batch(
            reaction,
            [record],
            topic=reaction.upstream_topic,
            partition=partition,
            commands_topic=mine,
            partitions_of=lambda topic: 1,
        )
        if result.failures:
            raise result.failures[0].error
        commands: list[tuple[str, bytes]] = []
        for (topic, _), records in result.outputs.items():
            for raw_key, raw_command, _ in records:
                if topic == mine:
                    commands.append((raw_key.decode("utf-8"), raw_command))
                else:
                    entry = (raw_key.decode("utf-8"), orjson.loads(raw_command))
                    self.sent.setdefault(topic, []).append(entry)
        return self.send_many(commands) if commands else []

    def given(self, key: str, events: Iterable[Event], *, version: int | None = None) -> State:
        """Fold `events` into `key`'s state as a read of the events topic would; returns it.

        `version` is the version the events were written at (e.g. 1 for history kept from
        before a type's shape changed): each is upcast to its type's current version before
        `apply`. None: they are current, as `decide` returns them.
        """
        aggregate = self.aggregate
        entry = self.entries.get(key)
        state = entry.state if entry is not None else aggregate.initial_state
        for event in events:
            if version is not None:
                event = upcast(aggregate, event, version)
            state = aggregate.apply(state, event)
        if entry is None:
            self.entries[key] = Entry(state, version=aggregate.state_version)
        else:
            entry.state = state
        return state

    def state(self, key: str) -> State:
        entry = self.entries.get(key)
        return entry.state if entry is not None else None

    def stored_keys(self) -> list[str]:
        return sorted(self.entries)
