"""The fold: per key, in (partition, offset) order, run the service's own `apply`.

The pure core (`EventFold`, `fold_batches`) needs only pyarrow. It folds Arrow batches in one
of two orders, with one per-event step:
- sorted by (key, partition, offset): it carries the current key's state across batch
  boundaries, so memory per task is one key's state plus one batch, whatever the number of
  events. `fold_events` gets that order with repartition by key (when the input is not
  partitioned by key) and sortWithinPartitions;
- hashed, in log order: a task that holds whole Kafka partitions gets each one's records in
  offset order from the reader, so the fold keeps every key's running fold in a dict and
  writes the rows when the task ends. No sort: the JVM's sort and its copies are gone, for a
  dict of every key of the task's partitions (the default in place; docs/backfill.md).
Then mapInArrow (a per-group applyInPandas, one pandas frame per key, was measured 15x slower
for the same work).

What the fold builds is the runtime's own Entry envelope (processing/core.py), from the headers
the engine puts on every event:
- offset: the `enhydra.command_offset` of the last command applied, so a clone resumes on the
  commands topic right after it;
- command_ids: the last `dedup_window` ids from `enhydra.command_id`, one per command.

Duplicated events (at-least-once outputs: a crash after producing a batch's events and before
its changelog write re-produces them on redelivery; exactly-once output aborts the first copy,
which read_committed never shows) are skipped the way the runtime skips a redelivered command:
a run of events whose command offset is at or below the last applied command is not applied
again. When events carry `enhydra.event_index` (the event's position among its command's
events) the rule is exact per event. Without it, a copy that directly follows its original in
the key's events (the crashed batch held no later command of that key) cannot be told apart
from one command that emitted several events, and is applied: the fold cannot know how many
events a command had.

Each event is brought to its type's current version (`enhydra.event_version`, the
aggregate's upcasters: evolution.py) before `apply`; an aggregate without versions skips that
and only refuses an event written by a newer deployment.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from enhydra.aggregate import Aggregate, loads
from enhydra.contracts.codec import Entry, encode_entry, encode_json
from enhydra.contracts.fold_input import fold_input
from enhydra.contracts.headers import (
    COMMAND_ID_HEADER,
    COMMAND_OFFSET_HEADER,
    EVENT_INDEX_HEADER,
    EVENT_VERSION_HEADER,
)
from enhydra.evolution import EventVersionError, Reader, reader, refuse

OUTPUT_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("partition", pa.int32()),
        ("value", pa.binary()),
        ("key_text", pa.string()),
        ("state", pa.string()),
        ("last_offset", pa.int64()),
        ("events", pa.int64()),
    ]
)
OUTPUT_DDL = (
    "key binary, partition int, value binary, key_text string, state string, "
    "last_offset long, events long"
)
_OUT_ROWS = 10_000


class FoldError(RuntimeError):
    """An event cannot be folded; the message names the key, partition and offset."""


def load_aggregate(target: str | Aggregate | Any) -> Aggregate:
    """An Aggregate from `module:attr` naming a Service or an Aggregate (or the object)."""
    obj = target
    if isinstance(target, str):
        module_name, sep, attr = target.partition(":")
        if not sep or not module_name or not attr:
            raise FoldError(f"{target!r}: expected MODULE:ATTR, e.g. ledger.service:service")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise FoldError(f"cannot import {module_name!r}: {exc}") from exc
        try:
            obj = getattr(module, attr)
        except AttributeError:
            raise FoldError(f"{module_name!r} has no attribute {attr!r}") from None
    aggregate = getattr(obj, "aggregate", obj)
    if not isinstance(aggregate, Aggregate):
        raise FoldError(f"{target!r} is {type(obj).__name__}, not a Service or an Aggregate")
    return aggregate


class EventFold:
    """The fold of one task: feed rows, get one entry per finished key.

    Two orders of input, one per-event step (dedup rule, upcast, `apply`, bookkeeping):
    - grouped (default): rows grouped by key, each key's in offset order, as a sort gives
      them. A key is finished when the next begins, so memory is one key's state.
    - `hashed`: keys in any interleaving, as a reader gives whole partitions in log order
      (`fold_rows` hands them over in chunks grouped by key, to look keys up less often).
      Every key's bookkeeping stays in a dict until `finish` (memory: every key of the task's
      partitions, the entries a service's store holds for them), and no sort is needed.
    Either way a key's rows must come in increasing offset order; a row at or below the key's
    previous offset is refused (FoldError), never folded out of order.

    `feed` is the hot loop of every backfill (one iteration per event, the user's `apply`
    inside): the current key's bookkeeping lives in local variables while a batch is folded
    and goes back to the object (or the dict) on a key change and between batches, error texts
    are only built on error, and command ids stay bytes until the key's entry is written (only
    the last `dedup_window` of them are ever decoded).
    """

    def __init__(
        self,
        apply: Callable[[Any, Any], Any],
        *,
        initial_state: Any = None,
        dedup_window: int = 100,
        decode: Callable[[bytes], Any] = loads,
        keep_events: bool = False,
        read: Reader | None = None,
        state_version: int = 1,
        hashed: bool = False,
    ) -> None:
        self.apply = apply
        self.state_version = state_version  # what the written entries record
        self.read = read  # upcasts an event from its version header (evolution.reader)
        self.keep_events = keep_events
        self.kept: list[tuple[Any, ...]] = []  # applied events, when keep_events
        self.initial_state = initial_state
        self.dedup_window = dedup_window
        self.decode = decode
        # hashed: key -> (partition, state, offset, index, previous, ids, applied, row offset)
        self.held: dict[bytes, tuple[Any, ...]] | None = {} if hashed else None
        self.key: bytes | None = None
        self.order: int | None = None
        self.events_seen = 0
        self._start(None, 0)

    def _start(self, key: bytes | None, partition: int) -> None:
        self.key = key
        self.partition = partition
        self.state = self.initial_state
        self.offset = -1  # command offset of the last command applied
        self.index = -1  # event index within it, when events carry one
        self.previous: int | None = None  # command offset of the previous row of this key
        self.ids: deque[bytes] = deque(maxlen=self.dedup_window)
        self.applied = 0
        self.at = -1  # Kafka offset of this key's previous row

    def _row(self) -> tuple[Any, ...]:
        return self._entry_row(
            self.key, self.partition, self.state, self.offset, self.ids, self.applied
        )

    def _entry_row(
        self,
        key: bytes | None,
        partition: int,
        state: Any,
        offset: int,
        ids_: Iterable[bytes],
        applied: int,
    ) -> tuple[Any, ...]:
        """The output row of one key: its Entry envelope, and the same decoded."""
        assert key is not None
        try:
            key_text: str | None = key.decode("utf-8")
        except UnicodeDecodeError:
            key_text = None
        try:
            ids = [i.decode("utf-8") for i in ids_]
        except UnicodeDecodeError as exc:
            raise FoldError(f"key {key!r}: a {COMMAND_ID_HEADER} is not UTF-8: {exc}") from None
        value = encode_entry(Entry(state, offset, ids, self.state_version))
        text = encode_json(state).decode("utf-8")
        return (key, partition, value, key_text, text, offset, applied)

    def feed(self, rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Fold rows (key, partition, offset, value, command_id, command_offset, index,
        version, fold_order): grouped by key in (fold_order, key) order, or, `hashed`, in any
        interleaving; each key's in offset order."""
        out: list[tuple[Any, ...]] = []
        apply = self.apply
        decode = self.decode
        read = self.read
        window = self.dedup_window
        held = self.held
        keep = self.kept.append if self.keep_events else None
        # the current key's bookkeeping, as locals (written back below and on a key change)
        current, part, current_order = self.key, self.partition, self.order
        state, last, last_index, previous = self.state, self.offset, self.index, self.previous
        ids, applied, at = self.ids, self.applied, self.at
        initial = self.initial_state
        seen = 0
        try:
            for row in rows:
                key, partition, offset, value, command_id, command_offset, index, version, order = (
                    row
                )
                seen += 1
                if key != current:
                    if key is None:
                        raise FoldError(f"event at partition {partition} offset {offset}: no key")
                    if held is not None:  # park the current key, take up this one
                        if current is not None:
                            book = (part, state, last, last_index, previous, ids, applied, at)
                            held[current] = book
                        book = held.get(key)
                        if book is None:
                            book = (partition, initial, -1, -1, None, deque(maxlen=window), 0, -1)
                        part, state, last, last_index, previous, ids, applied, at = book
                        current = key
                        if partition != part:
                            raise _split_key(key, part, partition)
                    else:
                        if current is not None:
                            if (
                                (key < current)
                                if order is None
                                else (order, key) < (current_order, current)
                            ):
                                raise FoldError("events must be grouped by key, in offset order")
                            self.state, self.offset, self.index = state, last, last_index
                            self.applied = applied
                            out.append(self._row())
                        self._start(key, partition)
                        current, part, current_order = key, partition, order
                        self.order = order
                        state, last, last_index, previous = initial, -1, -1, None
                        ids, applied, at = self.ids, 0, -1
                elif key is None:
                    raise FoldError(f"event at partition {partition} offset {offset}: no key")
                elif partition != part:
                    raise _split_key(key, part, partition)
                if offset <= at:
                    raise _backwards(key, partition, offset, at, "the same key", held is not None)
                at = offset
                event_index = None
                if command_offset is not None:
                    try:
                        cmd_offset = int(command_offset)
                        if index is not None:
                            event_index = int(index)
                    except ValueError:
                        raise _not_a_number(key, partition, offset, command_offset, index) from None
                    if event_index is not None:
                        duplicate = (cmd_offset, event_index) <= (last, last_index)
                    else:
                        duplicate = cmd_offset < last or (
                            cmd_offset == last and previous != cmd_offset
                        )
                    previous = cmd_offset
                    if duplicate:
                        continue
                    new_command = cmd_offset != last
                else:
                    cmd_offset = None
                if value is None:
                    raise _error(key, partition, offset, "the event has no value")
                try:
                    event = decode(value)
                except Exception as exc:
                    raise _error(
                        key, partition, offset, f"the event is not valid JSON: {exc}"
                    ) from None
                if read is not None:
                    try:
                        event = read(event, version)
                    except EventVersionError as exc:
                        raise _error(key, partition, offset, str(exc)) from exc
                elif version is not None and version != b"1":
                    raise _error(key, partition, offset, str(refuse(event, version)))
                try:
                    state = apply(state, event)
                except Exception as exc:
                    raise _error(
                        key, partition, offset, f"apply failed on {event!r}: {exc!r}"
                    ) from exc
                applied += 1
                if keep is not None:
                    keep((key, partition, value, command_id, command_offset, index, version))
                if cmd_offset is None:
                    continue  # an event from elsewhere: it changes state, not the bookkeeping
                last = cmd_offset
                last_index = event_index if event_index is not None else -1
                if new_command and window:
                    if command_id is None:
                        raise _error(
                            key, partition, offset, f"header {COMMAND_ID_HEADER} is missing"
                        )
                    ids.append(command_id)
        finally:
            self.events_seen += seen
            self.key, self.partition = current, part
            self.state, self.offset, self.index, self.previous = state, last, last_index, previous
            self.ids, self.applied, self.at = ids, applied, at
        return out

    def finish(self) -> list[tuple[Any, ...]]:
        """The entries not yet given: the last key's (its events may have spanned many
        batches), or, hashed, every key's, sorted by key (one row per key: a cheap sort)."""
        if self.key is None:
            return []
        held = self.held
        if held is None:
            row = self._row()
            self.key = None
            return [row]
        held[self.key] = (
            self.partition,
            self.state,
            self.offset,
            self.index,
            self.previous,
            self.ids,
            self.applied,
            self.at,
        )
        self.key = None
        rows = [
            self._entry_row(key, book[0], book[1], book[2], book[5], book[6])
            for key, book in held.items()
        ]
        held.clear()
        rows.sort(key=_first)
        return rows


def _first(row: tuple[Any, ...]) -> Any:
    return row[0]


def _backwards(
    key: bytes, partition: int, offset: int, at: int, of: str, hashed: bool
) -> FoldError:
    """Never fold out of order: a row at or below the previous offset is refused."""
    why = f"it comes after offset {at} of {of}: the events are not in offset order"
    if hashed:
        why += " (a reader that does not keep a partition's order? rerun with --fold sort)"
    return _error(key, partition, offset, why)


def _split_key(key: bytes, part: int, partition: int) -> FoldError:
    return FoldError(
        f"key {key!r} has events in partitions {part} and {partition}: the "
        "events topic was repartitioned or written with another partitioner, "
        "so there is no single order to fold them in"
    )


def _error(key: bytes, partition: int, offset: int, what: str) -> FoldError:
    """Errors name the row; the text is built only when one is raised (not once per event)."""
    return FoldError(f"key {key!r} at partition {partition} offset {offset}: {what}")


def _not_a_number(
    key: bytes, partition: int, offset: int, command_offset: bytes, index: bytes | None
) -> FoldError:
    name, raw = EVENT_INDEX_HEADER, index
    try:
        int(command_offset)
    except ValueError:
        name, raw = COMMAND_OFFSET_HEADER, command_offset
    return _error(key, partition, offset, f"header {name} = {raw!r} is not a number")


_CHUNK_ROWS = 50_000


def fold_rows(batches: Iterable[pa.RecordBatch], hashed: bool) -> Iterator[Iterator[tuple]]:
    """The fold's rows (FOLD_COLUMNS), an iterator per input batch, or, hashed, per chunk.

    Hashed, each chunk of about _CHUNK_ROWS rows is checked to be in its partitions' offset
    order, then grouped by key with Arrow's stable sort (each key's rows keep their order):
    a key's run of rows then costs one dict look-up, not one per row. Memory: one chunk.
    """
    if not hashed:
        for batch in batches:
            if batch.num_rows:
                yield _python_rows(fold_input(batch))
        return
    seen: dict[int, int] = {}  # partition -> offset of its last row so far
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        rows = fold_input(batch)
        _check_log_order(rows, seen)
        pending.append(rows)
        count += rows.num_rows
        if count >= _CHUNK_ROWS:
            yield _by_key(pending)
            pending, count = [], 0
    if pending:
        yield _by_key(pending)


def _python_rows(data: pa.RecordBatch | pa.Table) -> Iterator[tuple]:
    return zip(*(column.to_pylist() for column in data.columns), strict=True)


def _by_key(batches: list[pa.RecordBatch]) -> Iterator[tuple]:
    """Rows grouped by key, in order of first appearance: a stable sort of each row's key
    number in the chunk's dictionary of keys (7x cheaper than sorting the keys' bytes)."""
    table = pa.Table.from_batches(batches)
    numbers = pc.dictionary_encode(table.column("key").combine_chunks()).indices
    return _python_rows(table.take(pc.sort_indices(numbers)))


def _check_log_order(rows: pa.RecordBatch, seen: dict[int, int]) -> None:
    """Each partition's offsets rise, within the batch and after the batches before it."""
    partitions, offsets = rows.column("partition"), rows.column("offset")
    for partition in pc.unique(partitions).to_pylist():
        mine = pc.equal(partitions, partition)
        ours = offsets if pc.all(mine).as_py() else pc.filter(offsets, mine)
        before = pa.concat_arrays(
            [pa.array([seen.get(partition, -1)], pa.int64()), ours.slice(0, len(ours) - 1)]
        )
        backwards = pc.less_equal(ours, before)
        if pc.any(backwards).as_py():
            at = pc.index(backwards, True).as_py()
            keys = (
                rows.column("key")
                if len(ours) == rows.num_rows
                else pc.filter(rows.column("key"), mine)
            )
            raise _backwards(
                keys[at].as_py(),
                partition,
                ours[at].as_py(),
                before[at].as_py(),
                f"partition {partition}",
                True,
            )
        seen[partition] = ours[len(ours) - 1].as_py()


def _output_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in OUTPUT_SCHEMA]
    return pa.RecordBatch.from_arrays(
        [pa.array(col, f.type) for col, f in zip(columns, OUTPUT_SCHEMA, strict=True)],
        schema=OUTPUT_SCHEMA,
    )


def fold_batches(
    batches: Iterable[pa.RecordBatch],
    aggregate: Aggregate,
    *,
    dedup_window: int = 100,
    hashed: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Fold Kafka-shaped Arrow batches (see contracts/fold_input.py) into one row per key:
    sorted by (key, partition, offset), or, `hashed`, each partition's in offset order."""
    fold = _event_fold(aggregate, dedup_window, hashed=hashed)
    pending: list[tuple[Any, ...]] = []
    for rows in fold_rows(batches, hashed):
        pending.extend(fold.feed(rows))
        if len(pending) >= _OUT_ROWS:
            yield _output_batch(pending)
            pending = []
    pending.extend(fold.finish())
    if pending:
        yield _output_batch(pending)


EVENTS_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
EVENTS_DDL = (
    "key binary, value binary, partition int, headers array<struct<key: string, value: binary>>"
)


def _event_fold(
    aggregate: Aggregate, dedup_window: int, *, hashed: bool, keep_events: bool = False
) -> EventFold:
    return EventFold(
        aggregate.apply,
        initial_state=aggregate.initial_state,
        dedup_window=dedup_window,
        keep_events=keep_events,
        read=reader(aggregate),
        state_version=aggregate.state_version,
        hashed=hashed,
    )


def applied_events(
    batches: Iterable[pa.RecordBatch],
    aggregate: Aggregate,
    *,
    dedup_window: int = 100,
    hashed: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The events the fold applied, in fold order: each once, duplicates from redeliveries gone.

    Re-emitted to a topic they are a corrected history (one copy per command, per-key order),
    e.g. the events topic of a clone, whose state then agrees with its events. Each keeps the
    value and version it was written with: its readers upcast it as they would the original.
    """
    fold = _event_fold(aggregate, dedup_window, hashed=hashed, keep_events=True)
    for rows in fold_rows(batches, hashed):
        fold.feed(rows)
        if fold.kept:
            yield _events_batch(fold.kept)
            fold.kept = []


def _events_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    headers = []
    for _key, _partition, _value, command_id, command_offset, index, version in rows:
        row = []
        if command_id is not None:
            row.append({"key": COMMAND_ID_HEADER, "value": command_id})
        if command_offset is not None:
            row.append({"key": COMMAND_OFFSET_HEADER, "value": command_offset})
        if index is not None:
            row.append({"key": EVENT_INDEX_HEADER, "value": index})
        if version is not None:
            row.append({"key": EVENT_VERSION_HEADER, "value": version})
        headers.append(row or None)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r[0] for r in rows], pa.binary()),
            pa.array([r[2] for r in rows], pa.binary()),
            pa.array([r[1] for r in rows], pa.int32()),
            pa.array(headers, EVENTS_SCHEMA.field("headers").type),
        ],
        schema=EVENTS_SCHEMA,
    )


class Folder:
    """The mapInArrow function. It carries the Aggregate itself: its functions pickle by
    reference to the service's domain module, the one module of the service an executor
    imports (never the module that builds the Service, which would pull in the runtime).
    `counter` (a Spark accumulator) receives the number of events each task folded."""

    def __init__(
        self, aggregate: Aggregate, dedup_window: int, counter: Any = None, hashed: bool = False
    ) -> None:
        self.aggregate = aggregate
        self.dedup_window = dedup_window
        self.counter = counter
        self.hashed = hashed

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_id()
        seen = [0]

        def counted() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                seen[0] += batch.num_rows
                yield batch

        batches_ = counted()
        window, hashed = self.dedup_window, self.hashed
        for batch in fold_batches(batches_, self.aggregate, dedup_window=window, hashed=hashed):
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array([task] * batch.num_rows, pa.int32())],
                schema=SPARK_OUTPUT_SCHEMA,
            )
        if self.counter is not None:
            self.counter.add(seen[0])


class EventKeeper(Folder):
    """The mapInArrow function that yields the applied events instead of the entries."""

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from applied_events(
            batches, self.aggregate, dedup_window=self.dedup_window, hashed=self.hashed
        )


def _task_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


# Spark's fold output: OUTPUT_SCHEMA plus the task that folded the row. With the fold in
# place, one Kafka partition must be folded by exactly one task (else a key could get two
# rows); the job checks that from this column when it computes the cut.
SPARK_OUTPUT_SCHEMA = OUTPUT_SCHEMA.append(pa.field("task", pa.int32()))
SPARK_OUTPUT_DDL = OUTPUT_DDL + ", task int"


# --------------------------------------------------------------------------- spark


FOLDS = ("hash", "sort")


def prepare_events(events: Any, *, fold_order: bool = True) -> Any:
    """Project the events to what the fold reads; executors take the headers apart
    (`fold_input`, the one definition every fold path shares). `fold_order` (a hash of the key)
    is what the sort orders by first; the hash fold needs none."""
    from pyspark.sql import functions as F

    columns = ["key", "partition", "offset", "value", "headers"]
    if fold_order:
        columns.append(F.xxhash64("key").alias("fold_order"))
    return events.select(*columns)


def _hashed(shuffle: bool, fold: str | None) -> bool:
    """Whether the fold runs without a sort: by default in place, never after a shuffle.

    The hash fold needs each Kafka partition's rows in offset order in one task, which the
    readers give (Spark's Kafka source and read_range both read a partition's range from its
    start, in order) and a shuffle does not (rows from several map tasks interleave).
    """
    if fold is not None and fold not in FOLDS:
        raise FoldError(f"fold {fold!r}: expected one of {', '.join(FOLDS)}")
    if fold == "hash" and shuffle:
        raise FoldError("the hash fold needs whole Kafka partitions in place: no shuffle")
    return fold == "hash" or (fold is None and not shuffle)


def _fold_input(events: Any, shuffle: bool, tasks: int | None, hashed: bool) -> Any:
    """Rows as the fold reads them: in log order (hashed), else grouped by key in offset order.

    Hashed, each task's rows are a reader's, untouched: whole Kafka partitions, each in
    offset order (EventFold refuses a key whose offsets go backwards). Sorted, each task's
    rows are grouped by key, each key's in offset order, every key in one task. Without a
    shuffle the caller promises that the events of one Kafka partition (hence of every key in
    it, the topic being keyed) are in one Spark partition, as `read_events(...,
    split_records=None)` reads them; sorting inside each partition then replaces the exchange
    of every event between tasks. The sort is by a hash of the key first: Spark sorts on an
    8-byte prefix, and keys (`account-000123`) often share theirs.
    """
    prepared = prepare_events(events, fold_order=not hashed)
    if hashed:
        return prepared
    if shuffle:
        prepared = prepared.repartition(tasks, "key") if tasks else prepared.repartition("key")
    return prepared.sortWithinPartitions("fold_order", "key", "offset")


def _aggregate(target: str | Aggregate) -> Aggregate:
    return target if isinstance(target, Aggregate) else load_aggregate(target)


def corrected_events(
    events: Any,
    target: str | Aggregate,
    *,
    dedup_window: int = 100,
    tasks: int | None = None,
    shuffle: bool = True,
    fold: str | None = None,
) -> Any:
    """The events the fold applies (key, value, partition, headers), duplicates removed.

    Each key's events keep their order; hashed (`fold`, see `fold_events`), keys interleave
    as in the log, sorted, they come grouped by key."""
    hashed = _hashed(shuffle, fold)
    keeper = EventKeeper(_aggregate(target), dedup_window, hashed=hashed)
    return _fold_input(events, shuffle, tasks, hashed).mapInArrow(keeper, EVENTS_DDL)


def fold_events(
    events: Any,
    target: str | Aggregate,
    *,
    dedup_window: int = 100,
    tasks: int | None = None,
    shuffle: bool = True,
    counter: Any = None,
    fold: str | None = None,
) -> Any:
    """A DataFrame with one row per key: the Entry envelope the runtime would hold, decoded too.

    `events` has the read_events schema; the target is resolved here, on the driver. No event
    reaches the driver. `shuffle=False` folds every Spark partition in place; pass it only
    when each Kafka partition's events are in one Spark partition, in offset order (see
    `_fold_input`). `fold` is how a task folds: "hash" (the default in place) walks its rows
    in log order and holds every key's state in a dict until the task ends, no sort; "sort"
    (always after a shuffle) sorts the task's rows by key and holds one key's state at a time.
    Each task's rows come sorted by key (hashed) or by a hash of the key (sorted).
    """
    hashed = _hashed(shuffle, fold)
    folder = Folder(_aggregate(target), dedup_window, counter, hashed=hashed)
    return _fold_input(events, shuffle, tasks, hashed).mapInArrow(folder, SPARK_OUTPUT_DDL)
