"""Projections: read models folded from the events topic, one pure function per projection.

    project(state, event) -> state      state of one key (the event's key); None deletes it

A projection is an independent branch of a service: its own consumer group
(`<app>-projection-<name>`), its own store and changelog (`<app>-<name>-changelog`), so adding
one never disturbs the aggregate, and removing one leaves the aggregate as it was.

Each stored value remembers the events offset that last changed its key, so an event Kafka
redelivers after a crash is skipped instead of folded twice (the same rule as the aggregate's
store). The fold below is pure: the Kafka engine and unit tests run the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import orjson

from enhydra.aggregate import Event, State

Project = Callable[[State, Event], State]


@dataclass(frozen=True)
class Projection:
    """A read model: `project` folds a key's events into its state, queryable as store `name`."""

    name: str
    project: Project
    initial_state: State = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"projection name {self.name!r}: use letters, digits, '-' or '_'")
        if not callable(self.project):
            raise TypeError(f"projection {self.name!r}: project must be a callable")

    def group_id(self, app_id: str) -> str:
        return f"{app_id}-projection-{self.name}"

    def changelog_topic(self, app_id: str) -> str:
        return f"{app_id}-{self.name}-changelog"


@dataclass(slots=True)
class ProjectedEntry:
    """A projection's stored value: the state and the events offset that last changed it."""

    state: State
    offset: int = -1


def encode(entry: ProjectedEntry) -> bytes:
    return orjson.dumps((entry.offset, entry.state))


def decode(data: bytes) -> ProjectedEntry:
    offset, state = orjson.loads(data)
    return ProjectedEntry(state, offset)


@dataclass(slots=True)
class EventRecord:
    """The part of an events-topic record a projection needs."""

    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class FoldResult:
    changed: dict[str, ProjectedEntry | None] = field(default_factory=dict)  # None: deleted
    skipped: int = 0
    ignored: int = 0  # records without a key or a JSON object value: nothing to fold
    last_offset: int = -1


def fold_batch(
    projection: Projection,
    records: Iterable[EventRecord],
    load: Callable[[str], ProjectedEntry | None],
) -> FoldResult:
    """Fold one partition's events in offset order; keys changed earlier come from the batch."""
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
        entry = result.changed[key] if key in result.changed else load(key)
        if entry is not None and record.offset <= entry.offset:
            result.skipped += 1  # redelivered: already folded
            continue
        state = entry.state if entry is not None else projection.initial_state
        state = project(state, event)
        result.changed[key] = None if state is None else ProjectedEntry(state, record.offset)
    return result


def replay_projection(projection: Projection, events: Iterable[tuple[str, Event]]) -> dict:
    """Every key's state after folding (key, event) pairs: what the running projection holds."""
    states: dict[str, State] = {}
    for key, event in events:
        state = projection.project(states.get(key, projection.initial_state), event)
        if state is None:
            states.pop(key, None)
        else:
            states[key] = state
    return states
