"""Typed declarations: an aggregate's commands, events and state as msgspec Structs.

An aggregate may declare its command and event types (Structs tagged with their type name,
which is the "type" field of their JSON) and its state type. Then:
- a command is validated at the edge: JSON that fits no declared command type is an
  InvalidCommand (the dead-letter queue), with a reason naming the field;
- `decide` receives the typed command and state and returns typed events; `apply` receives
  typed events and state on every path: events read from history arrive as JSON, are upcast
  (evolution.py) and then converted, states loaded from the store are converted on load;
- the JSON Schema of every type is derived from it (`json_schema`), for `enhydra topology
  check` and the AsyncAPI document.

msgspec rather than pydantic: on the ledger's commands and events it validates and builds
values several times faster (bench/typed_declarations.py prints the ratio), and the budget is
the untyped ledger's throughput. Untyped aggregates never import this module: dicts in, dicts
out, and Spark executors of untyped services need no msgspec.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from enhydra.aggregate import InvalidCommand
from enhydra.evolution import TYPE_FIELD


class DeclarationError(ValueError):
    """A declared type cannot be used as a command, event or state type; says which."""


def tag_of(cls: type) -> str:
    """The type name a declared Struct stands for (its tag)."""
    config = getattr(cls, "__struct_config__", None)
    if config is None or not isinstance(config.tag, str):
        raise DeclarationError(
            f"{getattr(cls, '__qualname__', cls)!r} is not a tagged msgspec Struct: declare it "
            f'as `class {getattr(cls, "__name__", "X")}(msgspec.Struct, tag="<type name>")`'
        )
    if config.tag_field != TYPE_FIELD:
        raise DeclarationError(
            f"{cls.__qualname__}: tag_field is {config.tag_field!r}; the type name of a command "
            f'or event is its "{TYPE_FIELD}" field, so leave tag_field at its default'
        )
    return config.tag


def check_declarations(
    name: str, commands: Sequence[type], events: Sequence[type], state: type | None
) -> None:
    """Raise DeclarationError unless the declarations are usable (at the aggregate's build)."""
    for role, types in (("command", commands), ("event", events)):
        seen: dict[str, type] = {}
        for cls in types:
            tag = tag_of(cls)
            if tag in seen:
                raise DeclarationError(
                    f"aggregate {name!r}: {role} type {tag!r} is declared twice "
                    f"({seen[tag].__qualname__} and {cls.__qualname__})"
                )
            seen[tag] = cls
    if state is not None and not (isinstance(state, type) and issubclass(state, msgspec.Struct)):
        raise DeclarationError(f"aggregate {name!r}: state type {state!r} is not a msgspec Struct")


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of one declared type: its own object schema, nested types in $defs."""
    (ref,), components = msgspec.json.schema_components([cls], ref_template="#/$defs/{name}")
    own = ref["$ref"].rsplit("/", 1)[-1]
    schema = dict(components.pop(own))
    if components:
        schema["$defs"] = components
    return schema


class Typed:
    """The conversions one typed aggregate needs, built once."""

    def __init__(self, commands: Sequence[type], events: Sequence[type], state: type | None):
        self.command_types = tuple(commands)
        self.event_types = tuple(events)
        self.state_type = state
        self.command_names = tuple(tag_of(c) for c in commands)
        self.event_names = tuple(tag_of(e) for e in events)
        self._events = frozenset(events)
        # by type name: converting to one Struct is ~20x cheaper than to a Union of them
        self._commands = dict(zip(self.command_names, self.command_types, strict=True))
        self._event_classes = dict(zip(self.event_names, self.event_types, strict=True))
        self.encode = msgspec.json.Encoder().encode  # events, typed or dicts (plugins')

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt from the declared types where it is unpickled (a Spark executor): msgspec's
        encoder itself cannot be pickled."""
        return (Typed, (self.command_types, self.event_types, self.state_type))

    def command(self, command: dict[str, Any]) -> Any:
        """The decoded command as its declared type, or InvalidCommand saying why not."""
        if not self._commands:
            return command
        kind = command.get(TYPE_FIELD)
        cls = self._commands.get(kind)
        if cls is None:  # in msgspec's wording, which names the field
            if TYPE_FIELD not in command:
                raise InvalidCommand(f"Object missing required field `{TYPE_FIELD}`")
            raise InvalidCommand(
                f"unknown command type: Invalid value {kind!r} - at `$.{TYPE_FIELD}`"
            )
        try:
            return msgspec.convert(command, cls)
        except msgspec.ValidationError as exc:
            raise InvalidCommand(str(exc)) from None

    def event(self, event: Any) -> Any:
        """An event as its declared type: read from history (JSON) or returned by decide."""
        if type(event) is dict:
            cls = self._event_classes.get(event.get(TYPE_FIELD))
            return msgspec.convert(event, cls) if cls is not None else event
        if self._events and type(event) not in self._events:
            raise TypeError(
                f"{type(event).__qualname__} is not a declared event type "
                f"(declared: {', '.join(self.event_names)})"
            )
        return event

    def state(self, state: Any) -> Any:
        """A state loaded from the store (JSON) as the declared state type."""
        if type(state) is dict and self.state_type is not None:
            return msgspec.convert(state, self.state_type)
        return state


def typed_handlers(
    typed: Typed,
    decide: Callable[[Any, Any], Any],
    apply: Callable[[Any, Any], Any],
    parse: Callable[[Any], Any] | None,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[[Any], Any]]:
    """decide, apply and parse taking the runtime's values and handing the user typed ones."""
    to_command, to_event, to_state = typed.command, typed.event, typed.state
    state_type = typed.state_type

    def typed_parse(command: dict[str, Any]) -> Any:
        value = to_command(command)
        return parse(value) if parse is not None else value

    def typed_decide(state: Any, command: Any) -> Any:
        if state is not None and type(state) is not state_type:
            state = to_state(state)
        return decide(state, command)

    def typed_apply(state: Any, event: Any) -> Any:
        event = to_event(event)
        if state is not None and type(state) is not state_type:
            state = to_state(state)
        return apply(state, event)

    for wrapper, fn in ((typed_parse, parse), (typed_decide, decide), (typed_apply, apply)):
        wrapper.typed = True  # type: ignore[attr-defined]
        # the topology names and digests the user's functions, not these wrappers
        wrapper.parts = lambda f=fn: [("base", f)] if f is not None else []  # type: ignore[attr-defined]
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return typed_decide, typed_apply, typed_parse
