"""An in-memory driver: feed commands to an aggregate, see events, rejections and state.

Like Kafka Streams' TopologyTestDriver, it runs the very batch core the Kafka engine runs
(`process_batch`), so dedup, rejections and state are the same, without a broker. `given`
starts a key from a stored history, old event versions included, upcast like every reader of
the events topic does. `feed` gives a reaction an upstream event (reactions/) and sends the
commands it makes, with the ids derived from the event's position, as the Kafka step does.
`feed_saga` gives a saga (sagas/) an upstream event through its forwarder and inbox, and
`advance(seconds)` moves the sagas' clock, firing the deadlines that come due.
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
from enhydra.sagas.model import STATE, TIMERS, Saga, due_index, pending_deadlines, saga_batch
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


class MemoryStore:
    """A saga's store in memory: bytes keys in order, as a RocksDB partition iterates them."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def items(self, start: bytes = b"") -> Iterable[tuple[bytes, bytes]]:
        return iter(sorted(item for item in self.data.items() if item[0] >= start))

    def write(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        for key, value in puts:
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value


class Driver:
    """Processes commands synchronously, one partition, offsets counting from 0."""

    def __init__(self, target: Aggregate | Service, *, dedup_window: int = 100) -> None:
        self.aggregate = target.aggregate if isinstance(target, Service) else target
        self.reactions = {r.name: r for r in getattr(target, "reactions", ())}
        self.sagas = {s.name: s for s in getattr(target, "sagas", ())}
        self.saga_stores: dict[str, MemoryStore] = {}
        self.now = 0.0  # the sagas' clock, in seconds; advance() moves it
        self._inbox: dict[str, int] = {}  # saga -> next inbox offset
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

    def _saga(self, saga: Saga | str) -> Saga:
        if isinstance(saga, str):
            if saga not in self.sagas:
                known = ", ".join(sorted(self.sagas)) or "none"
                raise KeyError(f"no saga {saga!r} (this service's: {known})")
            saga = self.sagas[saga]
        self.sagas.setdefault(saga.name, saga)
        return saga

    def feed_saga(
        self,
        saga: Saga | str,
        source: str,
        key: str,
        event: Any,
        *,
        partition: int = 0,
        offset: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> list[Outcome]:
        """Give `saga` one event of `source` (an upstream app id), as its forwarder would.

        The event is re-keyed by `correlate` into the saga's inbox and handled at the current
        time (`now`); `offset=` an offset already used is a redelivery (skipped by its id).
        Commands for this service are processed like `send_many`, those for other services
        kept in `sent[topic]`; a failure in `correlate` or `handle` raises.
        """
        saga = self._saga(saga)
        forwarder = next((f for f in saga.forwarders() if f.source == source), None)
        if forwarder is None:
            raise KeyError(
                f"saga {saga.name!r} does not read {source!r} (sources: {', '.join(saga.sources)})"
            )
        place = (forwarder.upstream_topic, partition)
        if offset is None:
            offset = self._upstream.get(place, 0)
        self._upstream[place] = max(self._upstream.get(place, 0), offset + 1)
        record = InputRecord(
            offset, key.encode("utf-8"), msgspec.json.encode(event), headers=tuple(headers)
        )
        inbox = saga.inbox_topic("driver")
        forwarded = react_batch(
            forwarder,
            [record],
            topic=forwarder.upstream_topic,
            partition=partition,
            commands_topic=inbox,
            partitions_of=lambda topic: 1,
        )
        if forwarded.failures:
            raise forwarded.failures[0].error
        messages = []
        for out in forwarded.outputs.values():
            for raw_key, value, _ in out:
                at = self._inbox.get(saga.name, 0)
                self._inbox[saga.name] = at + 1
                messages.append(InputRecord(at, raw_key, value))
        return self._run_saga(saga, messages)

    def advance(self, seconds: float) -> list[Outcome]:
        """Move the sagas' clock; the deadlines due by then fire. Outcomes of their commands."""
        if seconds < 0:
            raise ValueError("time only moves forward: advance by a positive number of seconds")
        self.now += seconds
        outcomes = []
        for saga in list(self.sagas.values()):
            outcomes += self._run_saga(saga, [])
        return outcomes

    def _run_saga(self, saga: Saga, records: list[InputRecord]) -> list[Outcome]:
        store = self.saga_stores.setdefault(saga.name, MemoryStore())
        mine = "this service's commands"
        result = saga_batch(
            saga,
            records,
            load=store.get,
            due=lambda now_ms: due_index(store.items(TIMERS), now_ms),
            now=self.now,
            commands_topic=mine,
            partitions_of=lambda topic: 1,
        )
        if result.failures:
            raise result.failures[0].error
        store.write(result.puts.items())
        commands: list[tuple[str, bytes]] = []
        for (topic, _), out in result.outputs.items():
            for raw_key, raw_command, _ in out:
                if topic == mine:
                    commands.append((raw_key.decode("utf-8"), raw_command))
                else:
                    entry = (raw_key.decode("utf-8"), orjson.loads(raw_command))
                    self.sent.setdefault(topic, []).append(entry)
        return self.send_many(commands) if commands else []

    def saga_state(self, saga: Saga | str, key: str) -> Any:
        """A saga's state for correlation id `key` (None: not started, or ended)."""
        raw = self.saga_stores.get(self._saga(saga).name, MemoryStore()).get(STATE + key.encode())
        return orjson.loads(raw)["state"] if raw is not None else None

    def deadlines(self, saga: Saga | str, key: str) -> dict[str, float]:
        """`key`'s pending deadlines: id -> the time (on `now`'s clock) it fires."""
        store = self.saga_stores.get(self._saga(saga).name, MemoryStore())
        return pending_deadlines(store.get(STATE + key.encode()))

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
