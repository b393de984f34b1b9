"""Event versions and upcasters: how an event history written by older code stays readable.

The events topic is kept forever and a backfill folds it from offset 0, so `apply` meets
events written by every version of the service. An aggregate declares each event type's
current version (`event_versions`, 1 when undeclared) and, per (event type, from version), a
pure upcaster returning the event one version up. Every event the runtime publishes carries
its type's current version in the `enhydra.event_version` header (none: written before
versions existed, version 1). Every path that folds stored events (the Spark fold and time
travel, projections, the test Driver) brings each event to its current version here before
`apply`, so `apply` only ever sees current shapes.

An event of a version above the current one was written by a newer deployment: it is
refused with an error naming it, never guessed at. Aggregates that declare no versions pay
nothing on read but that check (see `reader`).

Pure (executors import it with the fold).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from enhydra.contracts.headers import EVENT_VERSION_HEADER, VERSION_1, version_header

if TYPE_CHECKING:
    from enhydra.aggregate import Aggregate

Event = Any
Upcaster = Callable[[Event], Event]
Upcasters = Mapping[tuple[str, int], Upcaster]
TYPE_FIELD = "type"  # the event field that names its type


class EventVersionError(ValueError):
    """An event cannot be brought to its type's current version."""


def event_type(event: Event) -> str | None:
    """The event's type (its "type" field, or a typed event's tag), or None without one."""
    if type(event) is dict:
        name = event.get(TYPE_FIELD)
        if isinstance(name, str):
            return name
        return None
    config = getattr(type(event), "__struct_config__", None)  # a typed event (messages.py)
    return config.tag if config is not None and isinstance(config.tag, str) else None


def validate(name: str, event_versions: Mapping[str, int], upcasters: Upcasters) -> None:
    """Raise ValueError unless every declared version is reachable from 1 by upcasters.

    Checked when the aggregate is built, so a missing step fails the deploy, not a backfill
    a year later.
    """
    for event, version in event_versions.items():
        if not isinstance(event, str) or not event:
            raise ValueError(f"aggregate {name!r}: event_versions keys are event type names")
        if type(version) is not int or version < 1:
            raise ValueError(
                f"aggregate {name!r}: event type {event!r} has version {version!r}; "
                "versions are whole numbers from 1"
            )
        for step in range(1, version):
            if (event, step) not in upcasters:
                raise ValueError(
                    f"aggregate {name!r}: event type {event!r} is at version {version} but has "
                    f"no upcaster from version {step} to {step + 1}; "
                    f"add upcasters[({event!r}, {step})]"
                )
    for key, fn in upcasters.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(
                f"aggregate {name!r}: upcaster key {key!r} is not (event type, from version)"
            )
        event, step = key
        current = event_versions.get(event, 1)
        if type(step) is not int or not 1 <= step < current:
            raise ValueError(
                f"aggregate {name!r}: upcaster ({event!r}, {step!r}) upcasts beyond the "
                f"declared version {current} of {event!r}; bump event_versions[{event!r}]"
            )
        if not callable(fn):
            raise ValueError(f"aggregate {name!r}: upcaster ({event!r}, {step}) is not callable")


def validate_state_versions(
    name: str, state_version: int, migrations: Mapping[int, Callable[[Any], Any]]
) -> None:
    """Raise ValueError unless every stored state version has a migration path to the current.

    Checked when the aggregate is built, like the upcasters.
    """
    if type(state_version) is not int or state_version < 1:
        raise ValueError(
            f"aggregate {name!r}: state_version {state_version!r}: versions are whole numbers "
            "from 1"
        )
    for step in range(1, state_version):
        if step not in migrations:
            raise ValueError(
                f"aggregate {name!r}: state is at version {state_version} but has no migration "
                f"from version {step} to {step + 1}; add state_migrations[{step}]"
            )
    for step, fn in migrations.items():
        if type(step) is not int or not 1 <= step < state_version:
            raise ValueError(
                f"aggregate {name!r}: state migration from version {step!r} migrates beyond the "
                f"declared state_version {state_version}; bump state_version"
            )
        if not callable(fn):
            raise ValueError(f"aggregate {name!r}: state migration from {step} is not callable")


class StateVersionError(ValueError):
    """A stored state cannot be brought to the current state version."""


def migrate_state(aggregate: Aggregate, state: Any, version: int) -> Any:
    """A stored state of `version` as the current state version: migrations chained.

    A state of a newer version was written by a newer deployment: refused, never guessed at.
    """
    current = aggregate.state_version
    if version == current:
        return state
    if version > current or version < 1:
        raise StateVersionError(
            f"aggregate {aggregate.name!r}: a stored state is at version {version}; this code "
            f"reads state versions up to {current} (written by a newer deployment?)"
        )
    for step in range(version, current):
        try:
            state = aggregate.state_migrations[step](state)
        except Exception as exc:
            raise StateVersionError(
                f"aggregate {aggregate.name!r}: the state migration from version {step} to "
                f"{step + 1} failed: {exc!r}"
            ) from exc
    return state


def current_version(aggregate: Aggregate, event: Event) -> int:
    """The version events of this one's type are written at now."""
    name = event_type(event)
    return aggregate.event_versions.get(name, 1) if name is not None else 1


def upcast(aggregate: Aggregate, event: Event, version: int) -> Event:
    """The event, written at `version`, as its type's current version: upcasters chained.

    Raises EventVersionError for a version above the current one (written by a newer
    deployment) or a missing step.
    """
    name = event_type(event)
    current = aggregate.event_versions.get(name, 1) if name is not None else 1
    if version == current:
        return event
    if version > current or version < 1:
        raise EventVersionError(
            f"event type {name!r} at version {version}: this code reads versions up to "
            f"{current}; it was written by a newer deployment, deploy that code to read it"
            if version > current
            else f"event type {name!r}: version {version} is not a version (they start at 1)"
        )
    upcasters = aggregate.upcasters
    for step in range(version, current):
        fn = upcasters.get((name, step))  # type: ignore[arg-type]
        if fn is None:
            raise EventVersionError(
                f"event type {name!r}: no upcaster from version {step} to {step + 1}"
            )
        try:
            event = fn(event)
        except Exception as exc:
            raise EventVersionError(
                f"event type {name!r}: the upcaster from version {step} to {step + 1} "
                f"failed: {exc!r}"
            ) from exc
        if event_type(event) != name:
            raise EventVersionError(
                f"event type {name!r}: the upcaster from version {step} to {step + 1} "
                f"returned an event of type {event_type(event)!r}; it must keep the type"
            )
    return event


def parse_version(raw: bytes | None) -> int:
    """The version in an `enhydra.event_version` header; no header means version 1."""
    if raw is None:
        return 1
    try:
        return int(raw)
    except ValueError:
        raise EventVersionError(
            f"header {EVENT_VERSION_HEADER} = {raw!r} is not a number"
        ) from None


Reader = Callable[[Event, "bytes | None"], Event]


def reader(aggregate: Aggregate) -> Reader | None:
    """What a read path calls on each decoded event and its raw version header, or None.

    None when the aggregate declares no versions: every event is then version 1 and the path
    skips the call, checking only `is_unversioned` (a comparison) to refuse newer events.
    """
    if not aggregate.event_versions:
        return None
    current = {name: version_header(v)[1] for name, v in aggregate.event_versions.items()}
    get = current.get

    def read(event: Event, raw: bytes | None) -> Event:
        if raw is not None and type(event) is dict:
            name = event.get(TYPE_FIELD)
            if type(name) is str and get(name, b"1") == raw:
                return event  # current already: the common case costs one lookup
        return upcast(aggregate, event, parse_version(raw))

    return read


def is_unversioned(raw: bytes | None) -> bool:
    """Whether an event read by an aggregate without versions is one it can apply as is."""
    return raw is None or raw == b"1"


def refuse(event: Event, raw: bytes | None) -> EventVersionError:
    """The error for an event an aggregate without versions cannot read (built on error)."""
    try:
        version = parse_version(raw)
    except EventVersionError as exc:
        return exc
    return EventVersionError(
        f"event type {event_type(event)!r} at version {version}: this code reads version 1 "
        "only; it was written by a newer deployment, deploy that code to read it"
    )


def read_event(aggregate: Aggregate, event: Event, raw: bytes | None) -> Event:
    """One event as the aggregate's `apply` expects it (for paths that read few events)."""
    read = reader(aggregate)
    if read is not None:
        return read(event, raw)
    if not is_unversioned(raw):
        raise refuse(event, raw)
    return event


def version_headers(aggregate: Aggregate) -> Callable[[Event], tuple[str, bytes]] | None:
    """The writer's side: event -> its version header; None when every event is version 1
    (the hot path then uses VERSION_1 without a call)."""
    versions = {name: version_header(v) for name, v in aggregate.event_versions.items()}
    if not any(header != VERSION_1 for header in versions.values()):
        return None
    get = versions.get

    def header_of(event: Event) -> tuple[str, bytes]:
        if type(event) is dict:  # most events: no call to event_type
            name = event.get(TYPE_FIELD)
            return get(name, VERSION_1) if isinstance(name, str) else VERSION_1
        name = event_type(event)
        return VERSION_1 if name is None else get(name, VERSION_1)

    return header_of
