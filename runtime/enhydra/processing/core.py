"""The pure heart of processing: a batch of command records in, outputs and state changes out.

No I/O here. The Kafka engine and the in-memory test driver both call `process_batch`, so what
a unit test sees is what production does.

Each stored value is an `Entry` (contracts/codec.py): the user's state plus the offset of the
last command applied and the ids of the last accepted commands, which make state
effectively-once under at-least-once delivery.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from enhydra.aggregate import Aggregate, Event, InvalidCommand, Rejection
from enhydra.contracts.codec import Entry, encode_entry, encode_json
from enhydra.contracts.partitioner import misplaced
from enhydra.contracts.records import InputRecord
from enhydra.contracts.sizes import record_size
from enhydra.errors.failure import Failure, Stage
from enhydra.evolution import migrate_state


@dataclass(slots=True)
class EmittedEvents:
    key: str
    command_id: str
    offset: int
    events: list[Event]
    payloads: list[bytes] = field(default_factory=list)  # the events, serialized


class OutputTooLarge(ValueError):
    """A record the batch would write is bigger than the broker accepts or max_output_bytes."""

    def __init__(self, kind: str, size: int, limit: int) -> None:
        super().__init__(
            f"{kind} of {size} bytes exceeds the {limit}-byte limit of a record (the smallest "
            "of max_output_bytes, the producer's max_request_size, the topics' max.message.bytes)"
        )
        self.kind, self.size, self.limit = kind, size, limit


# Room for an event's contract headers (contracts/headers.py) besides its command id: the
# command offset, the event index and the version, names included.
EVENT_HEADERS_BYTES = 160


@dataclass(slots=True)
class Rejected:
    key: str | None
    command_id: str | None
    offset: int
    reason: str
    command: Any
    payload: bytes = b""  # to_value() serialized: made once, where its size is checked

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
    failures: list[Failure] = field(default_factory=list)
    # A transient error stopped the batch at this record; it is retried after a backoff.
    interrupted: Failure | None = None
    skipped: int = 0
    last_offset: int = -1  # the last record handled; the next to read is last_offset + 1

    @property
    def event_count(self) -> int:
        return sum(len(e.events) for e in self.emitted)


def parse_command(record: InputRecord, id_field: str) -> tuple[str, str, dict[str, Any]]:
    """Return (key, command id, command) or raise InvalidCommand with a readable reason."""
    if not record.key:
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


def process_batch(
    aggregate: Aggregate,
    records: Iterable[InputRecord],
    load: Callable[[str], Entry | None],
    *,
    dedup_window: int = 100,
    transient: tuple[type[BaseException], ...] = (),
    give_up: Mapping[int, int] | None = None,
    max_output_bytes: int = 1_000_000,
    into: BatchResult | None = None,
    checked: Collection[str] = (),
    partition: int = 0,
    partitions: int = 0,
) -> BatchResult:
    """Run decide/apply over one partition's records in offset order.

    `records` are InputRecords or anything with the same attributes (the engine passes
    aiokafka's ConsumerRecords as they are). `load` reads a key's entry as of before this
    batch and must not be mutated; keys changed earlier in the batch are served from the batch
    itself, so one key may be updated many times per batch. A record that fails leaves its
    key's state untouched and is reported in `failures`; later records of the same key are
    processed as if it never came. An error of a `transient` type stops the batch at that
    record (`interrupted`) so it can be retried, unless its offset is in `give_up` (offset ->
    attempts made), which makes it an ordinary failure.

    `into` continues the result of an earlier call, for a batch processed in slices: its
    entries stay the batch's own, exactly as if the records had come in one call.

    Every record the batch would write must fit `max_output_bytes`: a command whose event or
    rejection would not is a PRODUCE failure and changes nothing, so the batch never fails
    halfway through publishing. State entries are encoded once per batch (`entry_records`);
    for the keys in `checked` (whose entry came out too large) every change is encoded and
    checked as it is made, and a command that makes the entry too large fails the same way.

    With `partitions`, the records came from `partition` of a topic of that many: a record
    whose key Kafka's default partitioner puts elsewhere fails (deserialize stage) and changes
    nothing, since its key's state lives in another task.
    """
    result = into if into is not None else BatchResult()
    changed = result.changed
    rejected = result.rejected
    emitted = result.emitted
    decide = aggregate.decide
    apply = aggregate.apply
    parse = aggregate.parse
    initial_state = aggregate.initial_state
    id_field = aggregate.command_id_field
    state_version = aggregate.state_version
    dumps = aggregate.typed.encode if aggregate.typed is not None else encode_json
    give_up = give_up or {}
    limit = max_output_bytes

    def reject(record: Any, key: str, command_id: str, reason: str, command: Any) -> None:
        rejection = Rejected(key, command_id, record.offset, reason, command)
        try:
            rejection.payload = encode_json(rejection.to_value())
        except TypeError as exc:  # a typed command orjson cannot serialize
            result.failures.append(Failure(record, Stage.PRODUCE, exc, key))
            return
        size = record_size(record.key, rejection.payload)
        if size > limit:
            error = OutputTooLarge("rejection", size, limit)
            result.failures.append(Failure(record, Stage.PRODUCE, error, key))
            return
        rejected.append(rejection)

    for record in records:
        offset = record.offset
        result.last_offset = offset
        if partitions and (wrong := misplaced(record.key, partition, partitions)) is not None:
            key = record.key.decode("utf-8", "replace") if record.key else None
            result.failures.append(Failure(record, Stage.DESERIALIZE, wrong, key))
            continue
        try:
            key, command_id, command = parse_command(record, id_field)
            if parse is not None:
                command = parse(command)
        except InvalidCommand as exc:
            key = record.key.decode("utf-8", "replace") if record.key else None
            result.failures.append(Failure(record, Stage.DESERIALIZE, exc, key))
            continue
        entry = changed.get(key)
        # An entry made earlier in this batch is ours to update in place; a loaded one is not.
        owned = entry is not None
        if entry is None:
            entry = load(key)
            if entry is not None and entry.version != state_version:
                try:  # written by older code: brought to the current state version once
                    state = migrate_state(aggregate, entry.state, entry.version)
                except ValueError as exc:
                    result.failures.append(Failure(record, Stage.PROCESS, exc, key))
                    continue
                entry = Entry(state, entry.offset, list(entry.command_ids), state_version)
        if entry is None:
            state = initial_state
        elif offset <= entry.offset:
            result.skipped += 1  # redelivered; its effect is already in the state
            continue
        elif command_id in entry.command_ids:
            reject(record, key, command_id, "duplicate command_id", command)
            continue
        else:
            state = entry.state
        try:
            events = decide(state, command)
            if type(events) is not list:
                events = list(events)
            for event in events:
                state = apply(state, event)
        except Rejection as rejection:
            reject(record, key, command_id, rejection.reason, command)
            continue
        except Exception as exc:
            if isinstance(exc, transient) and offset not in give_up:
                result.interrupted = Failure(record, Stage.PROCESS, exc, key)
                result.last_offset = offset - 1
                break
            attempts = give_up.get(offset, 0) + 1
            result.failures.append(Failure(record, Stage.PROCESS, exc, key, attempts))
            continue
        if not events:
            continue
        try:
            payloads = [dumps(event) for event in events]
            besides = record_size(record.key, None) + EVENT_HEADERS_BYTES + len(command_id)
            for payload in payloads:
                if len(payload) + besides > limit:
                    raise OutputTooLarge("event", len(payload) + besides, limit)
            if checked and key in checked:
                after = Entry(state, offset, _ids_after(entry, command_id, dedup_window))
                after.version = state_version
                size = record_size(record.key, encode_entry(after))
                if size > limit:
                    raise OutputTooLarge("state entry", size, limit)
        except (TypeError, OutputTooLarge) as exc:  # orjson raises TypeError for non-JSON
            result.failures.append(Failure(record, Stage.PRODUCE, exc, key))
            continue
        if owned:
            ids = entry.command_ids
            if dedup_window:
                ids.append(command_id)
                if len(ids) > dedup_window:
                    del ids[:-dedup_window]
            entry.state = state
            entry.offset = offset
            entry.version = state_version
        else:
            if entry is None:
                ids = [command_id] if dedup_window else []
            elif dedup_window:
                ids = (
                    [*entry.command_ids[-(dedup_window - 1) :], command_id]
                    if dedup_window > 1
                    else [command_id]
                )
            else:
                ids = list(entry.command_ids)
            changed[key] = Entry(state, offset, ids, state_version)
        emitted.append(EmittedEvents(key, command_id, offset, events, payloads))
    return result


def _ids_after(entry: Entry | None, command_id: str, dedup_window: int) -> list[str]:
    """The command ids an entry keeps once `command_id` is applied (as process_batch does)."""
    ids = list(entry.command_ids) if entry is not None else []
    return [*ids, command_id][-dedup_window:] if dedup_window else ids


def entry_records(
    result: BatchResult, limit: int, again: Callable[[set[str]], BatchResult]
) -> tuple[BatchResult, list[tuple[bytes, bytes]]]:
    """The batch's changed entries as changelog records (key, value), each within `limit`.

    Entries are encoded here, once per batch. When one would exceed the limit (rare: a state
    that grew too large), `again(keys)` runs the batch once more checking every change of
    those keys (process_batch's `checked`): the commands that would make an entry too large
    fail, and each key keeps the last entry that fits.
    """
    checked: set[str] = set()
    while True:
        puts: list[tuple[bytes, bytes]] = []
        grown: set[str] = set()
        for key, entry in result.changed.items():
            raw_key, value = key.encode("utf-8"), encode_entry(entry)
            if record_size(raw_key, value) > limit:
                grown.add(key)
            puts.append((raw_key, value))
        if grown <= checked:  # all fit (or decide did not repeat itself: the broker will say)
            return result, puts
        checked |= grown
        result = again(checked)
