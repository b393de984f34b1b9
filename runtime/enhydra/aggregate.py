"""The programming model: an aggregate is `decide` plus `apply`, both pure.

    decide(state, command) -> list[event]   validation and business rules; raise Rejection
    apply(state, event)    -> state         the only way state changes

Commands, events and states are JSON values (dicts, lists, str, int, float, bool, None), or,
when the aggregate declares them, msgspec Structs (messages.py): commands are then validated at
the edge and decide/apply receive typed values. The runtime runs the two functions per key;
the PySpark job runs the same `apply` over history.

Events are kept forever, so their shapes are versioned: `event_versions` and `upcasters`
(see evolution.py) let `apply` see only current shapes whatever version wrote an event. Stored
states carry a version too: `state_version` and `state_migrations` bring an entry written by
older code to the current shape when it is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from enhydra.contracts.codec import encode_json
from enhydra.evolution import validate, validate_state_versions

State = Any
Command = dict[str, Any]
Event = dict[str, Any]
Decide = Callable[[State, Command], Sequence[Event]]
Apply = Callable[[State, Event], State]


class InvalidCommand(ValueError):
    """The record is not a well-formed command: not JSON, no key or id, wrong fields or types.

    Raised by the runtime while reading a record and by an aggregate's `parse`; it goes to the
    deserialization error policy (e.g. the dead-letter queue), not to the rejections topic,
    because it is a bug in the sender rather than an answer to give.
    """


class Rejection(Exception):
    """Raised by `decide` when a command breaks a business rule.

    A rejection is an answer, not a failure: it is published to the rejections topic with the
    command id and this reason, and the state does not change.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Aggregate:
    """One store of state keyed like the commands topic, changed only through `apply`.

    `name` is the store name (queried at /v1/stores/<name>/...). Topic names default to
    `<app_id>-commands`, `<app_id>-events` and `<app_id>-rejections`.
    """

    name: str
    decide: Decide
    apply: Apply
    commands_topic: str | None = None
    events_topic: str | None = None
    rejections_topic: str | None = None
    command_id_field: str = "command_id"
    # Checks a decoded command's shape (fields, types, known type) and may normalise it;
    # raises InvalidCommand. decide then only deals with well-formed commands.
    parse: Callable[[Command], Command] | None = None
    initial_state: State = None
    description: str = field(default="", compare=False)
    # event type -> the version its events are written at now (1 when not listed), and
    # (event type, from version) -> a pure function returning the event one version up.
    # Readers of the events chain the upcasters before `apply` (evolution.py).
    event_versions: Mapping[str, int] = field(default_factory=dict)
    upcasters: Mapping[tuple[str, int], Callable[[Event], Event]] = field(default_factory=dict)
    # Typed declarations (messages.py): msgspec Structs tagged with their type name.
    command_types: Sequence[type] = ()
    event_types: Sequence[type] = ()
    state_type: type | None = None
    # The version states are stored at now, and from version -> a pure function returning a
    # state of that version one version up: run when an older entry is loaded.
    state_version: int = 1
    state_migrations: Mapping[int, Callable[[State], State]] = field(default_factory=dict)
    typed: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"aggregate name {self.name!r}: use letters, digits, '-' or '_'")
        if not callable(self.decide) or not callable(self.apply):
            raise TypeError(f"aggregate {self.name!r}: decide and apply must be callables")
        validate(self.name, self.event_versions, self.upcasters)
        validate_state_versions(self.name, self.state_version, self.state_migrations)
        if self.command_types or self.event_types or self.state_type is not None:
            self._declare_types()

    def _declare_types(self) -> None:
        """Wrap decide/apply/parse so the user's functions see typed values. A copy made by
        dataclasses.replace wraps the user's functions again with its own types; a plugin's
        dispatcher around typed handlers (plugins.extend) is left as it is."""
        from enhydra.messages import Typed, check_declarations, typed_handlers

        check_declarations(self.name, self.command_types, self.event_types, self.state_type)
        typed = Typed(self.command_types, self.event_types, self.state_type)
        object.__setattr__(self, "typed", typed)
        if getattr(getattr(self.apply, "base", None), "typed", False):
            return
        decide, apply, parse = (_unwrapped(f) for f in (self.decide, self.apply, self.parse))
        decide, apply, parse = typed_handlers(typed, decide, apply, parse)
        object.__setattr__(self, "decide", decide)
        object.__setattr__(self, "apply", apply)
        object.__setattr__(self, "parse", parse)

    def bind(self, app_id: str) -> BoundAggregate:
        """Resolve topic names for one application."""
        return BoundAggregate(
            aggregate=self,
            commands_topic=self.commands_topic or f"{app_id}-commands",
            events_topic=self.events_topic or f"{app_id}-events",
            rejections_topic=self.rejections_topic or f"{app_id}-rejections",
            changelog_topic=f"{app_id}-{self.name}-changelog",
        )


def _unwrapped(fn: Any) -> Any:
    """The user's function behind a typed wrapper (messages.typed_handlers)."""
    return fn.__wrapped__ if getattr(fn, "typed", False) else fn


@dataclass(frozen=True)
class BoundAggregate:
    """An aggregate with the concrete topic names of one application."""

    aggregate: Aggregate
    commands_topic: str
    events_topic: str
    rejections_topic: str
    changelog_topic: str

    @property
    def name(self) -> str:
        return self.aggregate.name


def replay(aggregate: Aggregate, events: Sequence[Event], state: State = None) -> State:
    """Fold events through `apply`: the definition of state that every path must agree with.

    The events are of their types' current versions (what `decide` returns); stored events of
    older versions go through `evolution.upcast` first.
    """
    for event in events:
        state = aggregate.apply(state, event)
    return state


def dumps(value: Any) -> bytes:
    """The JSON serde used for commands, events, rejections and states (typed ones too)."""
    return encode_json(value)


def loads(data: bytes) -> Any:
    return orjson.loads(data)
