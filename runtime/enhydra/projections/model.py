"""Projections: read models folded from the events topic, one pure function per projection.

    project(state, event) -> state      state of one key (the event's key); None deletes it

A projection is an independent branch of a service: its own consumer group
(`<app>-projection-<name>`), its own store and changelog (`<app>-<name>-changelog`), so adding
one never disturbs the aggregate, and removing one leaves the aggregate as it was.

Each stored value remembers the events offset that last changed its key, so an event Kafka
redelivers after a crash is skipped instead of folded twice (the same rule as the aggregate's
store). It also remembers the event's source, (`enhydra.command_offset`,
`enhydra.event_index`): the service itself publishes a batch's events again when it crashed
between publishing them and writing its changelog, and those copies sit at new offsets, but
their source is not beyond the one already folded (the Spark fold's rule). Each event is
brought to its type's current version (the aggregate's upcasters, evolution.py) before
`project`, as before `apply`. The fold below is pure: the Kafka engine and unit tests run the
same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from enhydra.aggregate import Aggregate, Event, State
from enhydra.contracts.headers import Source, event_source
from enhydra.evolution import Reader, is_unversioned, refuse, upcast

__all__ = [
    "EventRecord",
    "FoldResult",
    "ProjectedEntry",
    "Projection",
    "decode",
    "encode",
    "event_source",
    "fold_batch",
    "replay_projection",
]

Project = Callable[[State, Event], State]


class ReadModel:
    """What every read model (a RocksDB `Projection`, a `SqlProjection`) shares: a checked
    name and a `project` callable, its own consumer group and its task store's changelog."""

    name: str
    project: Callable[..., Any]

    def _check_name_and_project(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"projection name {self.name!r}: use letters, digits, '-' or '_'")
        if not callable(self.project):
            raise TypeError(f"projection {self.name!r}: project must be a callable")

    def group_id(self, app_id: str) -> str:
        return f"{app_id}-projection-{self.name}"

    def changelog_topic(self, app_id: str) -> str:
        return f"{app_id}-{self.name}-changelog"


@dataclass(frozen=True)
class Projection(ReadModel):
    """A read model: `project` folds a key's events into its state, queryable as store `name`."""

    name: str
    project: Project
    initial_state: State = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self._check_name_and_project()


@dataclass(slots=True)
class ProjectedEntry:
    """A projection's stored value: the state, the events offset and source that last changed it.

    A key `project` deleted keeps an entry with state None (a marker): dropping the value would
    drop the offset and source with it, and a redelivered event would be folded again.
    """

    state: State
    offset: int = -1
    source: Source | None = None

    @property
    def deleted(self) -> bool:
        return self.state is None


def encode(entry: ProjectedEntry) -> bytes:
    if entry.source is None:
        return orjson.dumps((entry.offset, entry.state))
    return orjson.dumps((entry.offset, entry.state, entry.source))


def decode(data: bytes) -> ProjectedEntry:
    offset, state, *source = orjson.loads(data)
    return ProjectedEntry(state, offset, tuple(source[0]) if source else None)


@dataclass(slots=True)
class EventRecord:
    """The part of an events-topic record a projection needs."""

    offset: int
    key: bytes | None
    value: bytes | None
    source: Source | None = None  # None: not published by an Enhydra service
    version: bytes | None = None  # its enhydra.event_version header (None: version 1)


@dataclass(slots=True)
class FoldResult:
    changed: dict[str, ProjectedEntry] = field(default_factory=dict)  # state None: deleted
    skipped: int = 0  # redelivered by Kafka
    duplicates: int = 0  # published again by the service
    ignored: int = 0  # records without a key or a JSON object value: nothing to fold
    last_offset: int = -1
    # A transient error stopped the fold at this record: (offset, error), retried later.
    interrupted: tuple[int, BaseException] | None = None


def fold_batch(
    projection: Projection,
    records: Iterable[EventRecord],
    load: Callable[[str], ProjectedEntry | None],
    *,
    transient: tuple[type[BaseException], ...] = (),
    give_up: Mapping[int, int] | None = None,
    read: Reader | None = None,
) -> FoldResult:
    """Fold one partition's events in offset order; keys changed earlier come from the batch.

    An error of a `transient` type in `project` stops the fold at that event (`interrupted`)
    so it is retried after a backoff, unless its offset is in `give_up` (retried until
    task_timeout already); any other error is raised: a read model must not skip an event.
    `read` upcasts each event from its version (evolution.reader of the service's aggregate);
    without it only version 1 is read and a newer event is an error (evolution.refuse).
    """
    give_up = give_up or {}
    result = FoldResult()
    project = projection.project
    for record in records:
        result.last_offset = record.offset
        if not record.key or record.value is None:
            result.ignored += 1
            continue
        key = record.key.decode("utf-8", "replace")
        event = orjson.loads(record.value)
        if not isinstance(event, dict):
            result.ignored += 1
            continue
        if read is not None:
            event = read(event, record.version)
        elif not is_unversioned(record.version):
            raise refuse(event, record.version)
        entry = result.changed[key] if key in result.changed else load(key)
        if entry is not None and record.offset <= entry.offset:
            result.skipped += 1  # redelivered: already folded
            continue
        source = record.source
        if entry is not None and entry.source is not None:
            if source is not None and source <= entry.source:
                result.duplicates += 1  # a copy of an event already folded
                continue
            source = source or entry.source
        state = entry.state if entry is not None and not entry.deleted else projection.initial_state
        try:
            state = project(state, event)
        except transient as exc:
            if record.offset in give_up:
                raise
            result.interrupted = (record.offset, exc)
            result.last_offset = record.offset - 1
            break
        result.changed[key] = ProjectedEntry(state, record.offset, source)
    return result


def replay_projection(
    projection: Projection,
    events: Iterable[tuple[str, Event] | tuple[str, Event, int]],
    *,
    aggregate: Aggregate | None = None,
) -> dict:
    """Every key's state after folding (key, event) pairs: what the running projection holds.

    A (key, event, version) triple is an event as stored at that version: it is upcast with
    the `aggregate`'s upcasters first, as the running projection does with the header.
    """
    states: dict[str, State] = {}
    for item in events:
        key, event = item[0], item[1]
        if len(item) == 3:
            if aggregate is None:
                raise ValueError(
                    "events with a version need the aggregate whose upcasters read them"
                )
            event = upcast(aggregate, event, item[2])  # type: ignore[misc]
        state = projection.project(states.get(key, projection.initial_state), event)
        if state is None:
            states.pop(key, None)
        else:
            states[key] = state
    return states
