"""Sagas (process managers): state per correlation id across services, and durable deadlines.

    handle(state, upstream) -> (state, [Emit], [Deadline | Cancel])

A saga reads the events of several services (its own included), finds the correlation id each
event belongs to (`correlate`), and keeps one state per id. `handle` returns the new state
(None ends the saga), commands to send now, and deadlines to schedule or cancel. A deadline
holds a command; when its time comes the command is sent (at least once, always with the
same id, so the receiving aggregate applies it once).

Co-partitioning: upstream topics are keyed however their services key them (an order id, a
payment id), so a saga does not read them directly. A forwarder per source (a reaction, on
the one task runner) re-keys each event by its correlation id into the saga's own inbox topic
`<app>-<saga>-saga-inbox`; the saga reads the inbox, so all of one id's events reach one
partition, in the order the forwarders wrote them. The inbox must have the service's
partition count (checked at start, like every topic).

Effectively once, everywhere:

- an event forwarded twice (a forwarder crashed before committing) carries the same message
  id (reactions: derived from the upstream position); the saga remembers the last
  `dedup_window` message ids per correlation id and skips a copy;
- an inbox record read again (the saga crashed before committing) is skipped by the offset
  each saga entry keeps;
- commands get ids derived from where they came from: `<saga>:<upstream position>:<n>`, and a
  fired deadline's `<saga>:<key>:deadline:<id>:<seq>` (seq counts the deadlines this id has
  scheduled, so a deadline set again after it fired makes a new command). A deadline fired
  twice around a crash sends the same id again, and the receiving aggregate skips the copy.

Deadlines live in the saga's store (changelog-backed, fenced like an aggregate's): in the
saga's entry, and in an index by due time (`t:<due ms><key>\\0<id>`) written in the same batch.
So they survive restarts, kill -9 and moving to another instance, and the task knows when
one is due from memory, seeking only then (engine.py TimerIndex). A cancelled deadline
(Cancel, scheduled again under its id, or the saga ended) is gone from both, so it never
fires. An ended saga's entry stays for `ended_retention_s` (a week by default), so a late
event of its id is ignored rather than starting it again, then goes: a timer of the same
index (deadline id "", which no deadline may have) removes it, counted as `forgotten` and
not as a pending deadline. A turn fires the deadlines due before
it handles its inbox records, at most `max_fired` per turn: a deadline whose command went out
just before a crash is the first thing the next turn does again (same id), before any later
event could cancel it. (Moving to an instance whose clock is behind can delay that; keep
clocks in sync.) The price: after a backlog, a deadline fires before events that happened
earlier but are still unread (docs/sagas.md, "After a backlog, deadlines win").

Everything here is pure: the Kafka step (engine.py), the Driver and unit tests run it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from enhydra.contracts.partitioner import partition_for
from enhydra.contracts.records import InputRecord
from enhydra.contracts.sizes import record_size
from enhydra.errors.failure import Failure, Stage
from enhydra.evolution import TYPE_FIELD
from enhydra.messages import tag_of
from enhydra.reactions.model import Emit, Reaction, Upstream, command_id, encode_command

__all__ = [
    "Cancel",
    "Deadline",
    "Saga",
    "SagaResult",
    "due_index",
    "saga_batch",
]

STATE = b"s:"  # s:<correlation id> -> the saga's entry (JSON)
TIMERS = b"t:"  # t:<due ms, 8 bytes big-endian><correlation id>\0<deadline id> -> [key, id, seq]
MESSAGE = "saga-message"  # the inbox record's type
# The field holding an inbox message's id (written by the forwarders, read by the saga): fixed,
# so a saga's own `command_id_field` (the commands it sends) cannot make its inbox unreadable.
MESSAGE_ID = "command_id"
# The longest a deadline may wait: its due time must fit the timer key (and a year-3000 due
# time is a bug, not a plan).
MAX_AFTER_S = 10 * 366 * 86400.0
# The deadline id of the timer that removes an ended saga's entry (no deadline may have it).
FORGET = ""
ENDED_RETENTION_S = 7 * 86400.0  # how long an ended saga's entry stays, by default


@dataclass(frozen=True, slots=True)
class Deadline:
    """Send `command` `after` seconds from now, unless cancelled first.

    Scheduling an id that is pending moves it (the old time no longer fires).
    """

    id: str
    after: float
    command: Emit


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the pending deadline `id` (nothing if none is pending)."""

    id: str


Handled = tuple[Any, Iterable[Emit] | None, Iterable[Deadline | Cancel] | None]
Handle = Callable[[Any, Upstream], Handled]
Correlate = Callable[[Upstream], str | None]


@dataclass(frozen=True)
class Saga:
    """A process manager: `handle` per correlation id over the events of `sources`.

    `sources`: upstream app ids whose events topics (`<source>-events`, or `events_topics`)
    the saga reads (this service's own app id for its own events), each mapped to the event
    types read from it (tagged msgspec Structs; empty: every event, as a dict). `correlate`
    returns the correlation id of an event, or None when the event is not for this saga.
    `state` is JSON (dicts, lists, numbers, strings). `sends_to` lists other services'
    commands topics it writes to, as for reactions.
    """

    name: str
    sources: Mapping[str, Sequence[type]] | Sequence[str]
    correlate: Correlate
    handle: Handle
    sends_to: Sequence[str] = ()
    events_topics: Mapping[str, str] = field(default_factory=dict)
    dedup_window: int = 100
    command_id_field: str = "command_id"
    description: str = field(default="", compare=False)
    # How long an ended saga's entry is kept (seconds): a late event of its id is ignored
    # meanwhile; after it, the entry is removed and such an event starts the saga again.
    # None: kept for good (the store grows by one entry per saga ever run).
    ended_retention_s: float | None = ENDED_RETENTION_S

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"saga name {self.name!r}: use letters, digits, '-' or '_'")
        keep = self.ended_retention_s
        number = isinstance(keep, int | float) and math.isfinite(keep)
        if keep is not None and not (number and 0 <= keep <= MAX_AFTER_S):
            raise ValueError(
                f"saga {self.name!r}: ended_retention_s={keep!r}; give seconds from 0 to "
                f"{MAX_AFTER_S:.0f} (10 years), or None to keep ended sagas for good"
            )
        sources = self.sources
        if isinstance(sources, str):
            raise TypeError(f"saga {self.name!r}: sources is a list of app ids, not one string")
        if not isinstance(sources, Mapping):
            sources = {source: () for source in sources}
        if not sources:
            raise ValueError(f"saga {self.name!r}: name at least one upstream app in `sources`")
        object.__setattr__(self, "sources", {s: tuple(t) for s, t in sources.items()})
        object.__setattr__(self, "sends_to", tuple(self.sends_to))
        object.__setattr__(self, "events_topics", dict(self.events_topics))
        if not callable(self.correlate) or not callable(self.handle):
            raise TypeError(f"saga {self.name!r}: correlate and handle must be callables")
        if self.dedup_window < 1:
            raise ValueError(f"saga {self.name!r}: dedup_window must be at least 1")
        for types in self.sources.values():  # type: ignore[union-attr]
            [tag_of(cls) for cls in types]  # raises with a hint for a non-Struct

    def inbox_topic(self, app_id: str) -> str:
        """Where forwarders re-key upstream events by correlation id: the saga's input."""
        return f"{app_id}-{self.name}-saga-inbox"

    def group_id(self, app_id: str) -> str:
        return f"{app_id}-saga-{self.name}"

    def changelog_topic(self, app_id: str) -> str:
        return f"{app_id}-{self.name}-changelog"

    def upstream_topic(self, source: str) -> str:
        return self.events_topics.get(source) or f"{source}-events"

    def forwarders(self) -> list[Reaction]:
        """One reaction per source, writing each event it reads to the inbox, keyed by id
        (the engine gives them the inbox as their commands topic)."""
        return [
            Reaction(
                forwarder_name(self.name, source),
                source,
                _forward(self, source),
                reads=types,
                events_topic=self.events_topics.get(source),
                command_id_field=MESSAGE_ID,
                description=f"saga {self.name!r}: {source}'s events by correlation id",
            )
            for source, types in self.sources.items()  # type: ignore[union-attr]
        ]


def forwarder_name(saga: str, source: str) -> str:
    """`<saga>-from-<source>`, usable as a reaction name whatever the source's app id holds:
    other characters become '_' and a digest of the source keeps two such names apart."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", source)
    if safe != source:
        safe += "-" + hashlib.sha1(source.encode()).hexdigest()[:8]
    return f"{saga}-from-{safe}"


class NotACorrelationId(TypeError):
    """`correlate` returned something other than a string or None."""


def _forward(saga: Saga, source: str) -> Callable[[Upstream], list[Emit]]:
    def forward(upstream: Upstream) -> list[Emit]:
        key = saga.correlate(upstream)
        if key is None:
            return []
        if not isinstance(key, str) or not key:
            raise NotACorrelationId(
                f"saga {saga.name!r}: correlate must return a non-empty str or None, got {key!r}"
            )
        event = upstream.event
        if isinstance(event, msgspec.Struct):
            event = msgspec.to_builtins(event)
        message = {
            TYPE_FIELD: MESSAGE,
            "source": source,
            "key": upstream.key,
            "event": event,
            "position": list(upstream.position),
            "offset": upstream.offset,
            "headers": _text_headers(upstream.headers),
        }
        return [Emit(key, message)]  # the forwarder's commands topic is the inbox

    return forward


def _text_headers(headers: Mapping[str, bytes]) -> dict[str, str]:
    """The upstream's headers that are text (Enhydra's are: event version, ids), for the
    inbox's JSON; a binary header value is not carried."""
    carried = {}
    for name, value in headers.items():
        try:
            carried[name] = value.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return carried


# entries -----------------------------------------------------------------------------------
def new_entry() -> dict[str, Any]:
    """A saga entry: the user's state and what the runtime needs to apply each event once."""
    return {"state": None, "offset": -1, "seen": [], "seq": 0, "deadlines": {}, "ended": False}


def timer_key(due_ms: int, key: str, deadline_id: str) -> bytes:
    return TIMERS + due_ms.to_bytes(8, "big") + key.encode() + b"\0" + deadline_id.encode()


def is_forget(timer: bytes) -> bool:
    """Whether a timer key is an ended saga's removal (its deadline id is FORGET, empty)."""
    return timer.endswith(b"\0")


def timer_due(timer: bytes) -> int:
    return int.from_bytes(timer[len(TIMERS) : len(TIMERS) + 8], "big")


def due_index(items: Iterable[tuple[bytes, bytes]], now_ms: int) -> Iterable[tuple[bytes, bytes]]:
    """The timers due by `now_ms` from a store's items iterated from TIMERS in key order."""
    for timer, value in items:
        if not timer.startswith(TIMERS) or timer_due(timer) > now_ms:
            return
        yield timer, value


def deadline_command_id(saga: str, key: str, deadline_id: str, seq: int) -> str:
    return f"{saga}:{key}:deadline:{deadline_id}:{seq}"


# the batch ---------------------------------------------------------------------------------
@dataclass(slots=True)
class SagaResult:
    """What a batch made: commands per (topic, partition), store puts, counts, failures."""

    outputs: dict[tuple[str, int], list[tuple[bytes, bytes, None]]] = field(default_factory=dict)
    puts: dict[bytes, bytes | None] = field(default_factory=dict)  # in order, last one wins
    failures: list[Failure] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    last_offset: int = -1
    interrupted: tuple[int, BaseException] | None = None
    # the entries it changed (None: removed, an ended saga forgotten)
    entries: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # The timer index: how many pending timers the batch added (negative: removed), the
    # lowest timer key it wrote, the last one it fired (or removed) in key order, and a time
    # (ms) by which no timer pending before the batch is still due (all of them fired).
    timers: int = 0
    earliest_timer: bytes | None = None
    fired_through: bytes | None = None
    none_due_by: int | None = None

    def timer(self, key: bytes, value: bytes | None) -> None:
        self.puts[key] = value
        counted = not is_forget(key)  # removing an ended entry is no deadline pending
        if value is None:
            self.timers -= counted
        else:
            self.timers += counted
            if self.earliest_timer is None or key < self.earliest_timer:
                self.earliest_timer = key

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


COUNTERS = (
    "handled",
    "commands",
    "scheduled",
    "cancelled",
    "fired",
    "duplicates",
    "ignored",
    "forgotten",
)


class BadMessage(ValueError):
    """An inbox record that is not a forwarded event."""


def _message(saga: Saga, record: Any) -> tuple[str, dict[str, Any]]:
    if record.key is None:
        raise BadMessage("inbox record has no key (the correlation id)")
    try:
        message = orjson.loads(record.value) if record.value is not None else None
    except orjson.JSONDecodeError as exc:
        raise BadMessage(f"inbox value is not valid JSON: {exc}") from None
    if not isinstance(message, dict) or message.get(TYPE_FIELD) != MESSAGE:
        raise BadMessage("inbox record is not a forwarded event (type saga-message)")
    if not isinstance(message.get(MESSAGE_ID), str):
        raise BadMessage(f"inbox record has no {MESSAGE_ID!r}")
    return record.key.decode("utf-8", "replace"), message


def _upstream(saga: Saga, message: dict[str, Any]) -> Upstream:
    source = message.get("source")
    types = {tag_of(cls): cls for cls in saga.sources.get(source, ())}  # type: ignore[union-attr]
    event = message.get("event")
    if types and isinstance(event, dict):
        cls = types.get(event.get(TYPE_FIELD))
        if cls is None:
            raise BadMessage(f"{source} event of type {event.get(TYPE_FIELD)!r} is not read here")
        try:
            event = msgspec.convert(event, cls)
        except msgspec.ValidationError as exc:
            raise BadMessage(f"{source} event {tag_of(cls)!r}: {exc}") from None
    topic, upstream_partition, offset, index = message["position"]
    headers = message.get("headers")
    return Upstream(
        message.get("key"),
        event,
        topic,
        upstream_partition,
        message.get("offset", offset),
        index,
        {k: v.encode() for k, v in headers.items() if isinstance(v, str)}
        if isinstance(headers, dict)
        else {},
        (offset, index),
    )


class _Writer:
    """Encodes commands placed by key; raises ValueError/TypeError for one it cannot write."""

    def __init__(
        self,
        saga: Saga,
        commands_topic: str,
        partitions_of: Callable[[str], int],
        max_record_bytes: int,
    ) -> None:
        self.saga = saga
        self.commands_topic = commands_topic
        self.partitions_of = partitions_of
        self.max_record_bytes = max_record_bytes

    def target(self, emit: Emit) -> str:
        if not isinstance(emit, Emit):
            raise TypeError(f"saga {self.saga.name!r} must send Emit(...)s, got {emit!r}")
        topic = emit.topic or self.commands_topic
        self.partitions_of(topic)  # an undeclared topic fails now, not when a deadline fires
        return topic

    def record(self, emit: Emit, id_: str) -> tuple[tuple[str, int], tuple]:
        topic = self.target(emit)
        raw_key = emit.key.encode("utf-8")
        value = encode_command(emit, self.saga.command_id_field, id_)
        size = record_size(raw_key, value)
        if size > self.max_record_bytes:
            raise ValueError(
                f"command of {size} bytes exceeds the {self.max_record_bytes}-byte record limit"
            )
        return (topic, partition_for(raw_key, self.partitions_of(topic))), (raw_key, value, None)


def _plain(command: Any) -> Any:
    return msgspec.to_builtins(command) if isinstance(command, msgspec.Struct) else command


def saga_batch(
    saga: Saga,
    records: Iterable[Any],
    *,
    load: Callable[[bytes], bytes | None],
    due: Callable[[int], Iterable[tuple[bytes, bytes]]],
    now: float,
    commands_topic: str,
    partitions_of: Callable[[str], int],
    transient: tuple[type[BaseException], ...] = (),
    give_up: Mapping[int, int] | None = None,
    max_record_bytes: int = 1_000_000,
    max_fired: int | None = None,
) -> SagaResult:
    """Fire the deadlines due, then handle one inbox partition's records in offset order.

    `load(store key)` reads an entry from the store, `due(now_ms)` the store's timers due by
    then in key order (due_index); `now` is the task's clock in seconds. At most `max_fired`
    deadlines fire (the rest stay due for the next turn): one turn stays short however many
    came due at once. `last_offset` stays -1 when no record is handled: a turn that only
    fires deadlines moves no input offset.
    """
    give_up = give_up or {}
    result = SagaResult()
    entries = result.entries
    writer = _Writer(saga, commands_topic, partitions_of, max_record_bytes)
    now_ms = int(now * 1000)

    def entry_of(key: str) -> dict[str, Any] | None:
        if key in entries:
            return entries[key]
        raw = load(STATE + key.encode())
        return orjson.loads(raw) if raw is not None else None

    timers = list(itertools.islice(due(now_ms), max_fired))
    _fire(saga, result, writer, entry_of, timers)
    if max_fired is None or len(timers) < max_fired:
        result.none_due_by = now_ms
    for record in records:
        offset = record.offset
        result.last_offset = offset
        try:
            key, message = _message(saga, record)
        except BadMessage as exc:
            result.failures.append(Failure(record, Stage.DESERIALIZE, exc, None))
            continue
        entry = entry_of(key)
        message_id = message[MESSAGE_ID]
        if entry is not None and (offset <= entry["offset"] or message_id in entry["seen"]):
            result.count("duplicates")  # read again, or forwarded again: already handled
            continue
        entry = _copy(entry) if entry is not None else new_entry()
        if entry["ended"]:
            result.count("ignored")
        else:
            try:
                upstream = _upstream(saga, message)
            except BadMessage as exc:
                result.failures.append(Failure(record, Stage.DESERIALIZE, exc, key))
                continue
            try:
                state, emits, timers = saga.handle(entry["state"], upstream)
                emits, timers = list(emits or ()), list(timers or ())
            except Exception as exc:
                if isinstance(exc, transient) and offset not in give_up:
                    result.interrupted = (offset, exc)
                    result.last_offset = offset - 1
                    break
                attempts = give_up.get(offset, 0) + 1
                result.failures.append(Failure(record, Stage.PROCESS, exc, key, attempts))
                continue
            try:
                made = [
                    writer.record(emit, command_id(saga.name, upstream.position, n))
                    for n, emit in enumerate(emits)
                ]
                changes = _schedule(writer, key, entry, timers, now_ms, state is None)
                orjson.dumps(state)  # the state must be JSON
            except (TypeError, ValueError) as exc:
                result.failures.append(Failure(record, Stage.PRODUCE, exc, key))
                continue
            for place, out in made:
                result.outputs.setdefault(place, []).append(out)
            result.count("handled")
            result.count("commands", len(made))
            for timer, value in changes:
                result.timer(timer, value)
                if not is_forget(timer):
                    result.count("scheduled" if value is not None else "cancelled")
            entry["state"] = state
            entry["ended"] = state is None
        entry["offset"] = offset
        entry["seen"] = [*entry["seen"], message_id][-saga.dedup_window :]
        entries[key] = entry
        result.puts[STATE + key.encode()] = orjson.dumps(entry)
    return result


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    return {**entry, "deadlines": dict(entry["deadlines"]), "seen": list(entry["seen"])}


def _schedule(
    writer: _Writer,
    key: str,
    entry: dict[str, Any],
    timers: list[Deadline | Cancel],
    now_ms: int,
    ended: bool,
) -> list[tuple[bytes, bytes | None]]:
    """Apply `timers` to `entry`'s deadlines; the timer index changes (None: removed)."""
    changes: list[tuple[bytes, bytes | None]] = []
    deadlines = entry["deadlines"]

    def drop(deadline_id: str) -> None:
        pending = deadlines.pop(deadline_id, None)
        if pending is not None:
            changes.append((timer_key(pending[0], key, deadline_id), None))

    for timer in timers:
        if isinstance(timer, Cancel):
            drop(timer.id)
        elif isinstance(timer, Deadline):
            if not isinstance(timer.id, str) or not timer.id or "\0" in timer.id:
                raise ValueError(
                    f"a deadline id must be a non-empty str without NUL, got {timer.id!r}"
                )
            after = timer.after
            if (
                not isinstance(after, int | float)
                or not math.isfinite(after)
                or after > MAX_AFTER_S
            ):
                raise ValueError(
                    f"deadline {timer.id!r}: after={after!r} seconds; give a finite number of "
                    f"seconds up to {MAX_AFTER_S:.0f} (10 years)"
                )
            topic = writer.target(timer.command)
            command = _plain(timer.command.command)
            writer.record(timer.command, deadline_command_id(writer.saga.name, key, timer.id, 0))
            drop(timer.id)
            entry["seq"] += 1
            due_ms = now_ms + max(0, round(after * 1000))
            deadlines[timer.id] = [due_ms, entry["seq"], timer.command.key, command, topic]
            changes.append((timer_key(due_ms, key, timer.id), orjson.dumps([key, timer.id])))
        else:
            raise TypeError(f"a saga schedules Deadline(...) or Cancel(...), got {timer!r}")
    if ended:
        for deadline_id in list(deadlines):
            drop(deadline_id)
        keep = writer.saga.ended_retention_s
        if keep is not None:
            due_ms = now_ms + max(0, round(keep * 1000))
            changes.append((timer_key(due_ms, key, FORGET), orjson.dumps([key, FORGET])))
    return changes


class DeadlineFailed(ValueError):
    """A due deadline whose command cannot be sent (its target or its size is no longer
    allowed): dead-lettered with its origin, so it does not fail every owner in turn."""


def _fire(
    saga: Saga,
    result: SagaResult,
    writer: _Writer,
    entry_of: Callable[[str], dict[str, Any] | None],
    due: Iterable[tuple[bytes, bytes]],
) -> None:
    """Send the commands of the timers `due` and remove them (with their entries' deadlines).

    A timer fires only if its saga entry holds that deadline at that time; one that does not
    (it cannot happen, as both are written in one batch) is removed. A deadline whose command
    cannot be written goes to the error policies (a PRODUCE failure of a record that names
    the saga, the correlation id and the deadline) and is removed too.
    """
    for timer, value in due:
        result.fired_through = timer
        key, deadline_id = orjson.loads(value)
        entry = entry_of(key)
        if deadline_id == FORGET:
            result.timer(timer, None)
            if entry is not None and entry["ended"]:
                result.entries[key] = None  # a later event of this id starts it again
                result.puts[STATE + key.encode()] = None
                result.count("forgotten")
            continue
        pending = entry["deadlines"].get(deadline_id) if entry is not None else None
        if pending is None or timer_key(pending[0], key, deadline_id) != timer:
            result.timer(timer, None)
            continue
        _, seq, command_key, command, topic = pending
        emit = Emit(command_key, command, topic=topic)
        try:
            place, out = writer.record(emit, deadline_command_id(saga.name, key, deadline_id, seq))
        except (TypeError, ValueError) as exc:
            origin = {"saga": saga.name, "key": key, "deadline": deadline_id, "seq": seq}
            letter = InputRecord(-1, key.encode(), orjson.dumps({**origin, "pending": pending}))
            error = DeadlineFailed(f"saga {saga.name!r} {key!r} deadline {deadline_id!r}: {exc}")
            result.failures.append(Failure(letter, Stage.PRODUCE, error, key))
        else:
            result.outputs.setdefault(place, []).append(out)
            result.count("fired")
            result.count("commands")
        entry = _copy(entry)
        del entry["deadlines"][deadline_id]
        result.entries[key] = entry
        result.timer(timer, None)
        result.puts[STATE + key.encode()] = orjson.dumps(entry)


def pending_deadlines(entry_value: bytes | None) -> dict[str, float]:
    """A stored entry's pending deadlines: id -> due time in seconds (for tests, the Driver)."""
    if entry_value is None:
        return {}
    return {i: d[0] / 1000 for i, d in orjson.loads(entry_value)["deadlines"].items()}
