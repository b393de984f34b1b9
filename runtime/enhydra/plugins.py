"""Handler plugins: installed packages that add command handlers and projections to a service.

A package declares an entry point in the group `enhydra.handlers`; its object is a `Plugin` (or
a callable returning one):

    [project.entry-points."enhydra.handlers"]
    ledger-audit = "ledger_audit:plugin"

A service loads every plugin that applies to its aggregate when it starts, logs them, lists them
in `/v1/stats` (`service.plugins`) and in its topology. A plugin that fails to import stops the
start with an error naming the plugin and its entry point: a half-extended service would answer
queries for read models it does not build.

`Handler` + `extend` are also how code in the service itself (e.g. `enhydra generate handler`)
adds a command type without touching the existing decide/apply.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from enhydra.aggregate import Aggregate, Apply, Command, Decide, Event, State
from enhydra.evolution import TYPE_FIELD
from enhydra.evolution import event_type as type_of
from enhydra.projections.model import Projection

GROUP = "enhydra.handlers"


class PluginError(RuntimeError):
    """A plugin cannot be loaded or does not fit the service; the message names it."""


@dataclass(frozen=True)
class Handler:
    """One command type with its own decide and the apply of each event type it emits."""

    command: str
    decide: Decide
    apply: Mapping[str, Apply]
    parse: Callable[[Command], Command] | None = None
    type_field: str = TYPE_FIELD
    # The versions of the event types this handler emits and their upcasters, as on an
    # Aggregate (evolution.py): merged into the extended aggregate.
    event_versions: Mapping[str, int] = field(default_factory=dict)
    upcasters: Mapping[tuple[str, int], Callable[[Event], Event]] = field(default_factory=dict)
    # The command's and the events' declared shapes (msgspec Structs, as messages.py takes
    # them): their JSON Schemas go into the topology's `messages` and the AsyncAPI document.
    # Undeclared, the types are still listed there, without a schema.
    command_type: type | None = None
    event_types: Mapping[str, type] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("handler command type must be a non-empty string")
        if not callable(self.decide) or not all(callable(f) for f in self.apply.values()):
            raise TypeError(f"handler {self.command!r}: decide and apply must be callables")
        for what, names in (
            ("event_versions", self.event_versions),
            ("event_types", self.event_types),
        ):
            foreign = sorted(set(names) - set(self.apply))
            if foreign:
                raise ValueError(
                    f"handler {self.command!r}: {what} names {foreign}, which it does not "
                    "apply; a handler declares only its own event types"
                )


class _Dispatch:
    """Routes by a type field to an extension's function, else to the base function.

    `declared` holds the handlers' message type per type name (None: undeclared), for the
    topology (message_types).
    """

    def __init__(
        self,
        base: Callable | None,
        by_type: dict[str, Callable],
        field_name: str,
        declared: dict[str, type | None] | None = None,
    ):
        self.base = base
        self.by_type = by_type
        self.field_name = field_name
        self.declared = dict(declared or {})
        self.__qualname__ = type(self).__qualname__
        self.__module__ = __name__

    def target(self, value: Any) -> Callable | None:
        if type(value) is dict:
            return self.by_type.get(value.get(self.field_name), self.base)  # type: ignore[arg-type]
        return self.by_type.get(type_of(value), self.base)  # type: ignore[arg-type]

    def parts(self) -> list[tuple[str, Callable]]:
        """(label, function) of every component: the topology lists them."""
        head = [("base", self.base)] if self.base is not None else []
        return head + sorted(self.by_type.items())


class _Decide(_Dispatch):
    def __call__(self, state: State, command: Command) -> Sequence[Event]:
        fn = self.target(command)
        return fn(state, command)  # type: ignore[misc]


class _Apply(_Dispatch):
    def __call__(self, state: State, event: Event) -> State:
        fn = self.target(event)
        return fn(state, event)  # type: ignore[misc]


class _Parse(_Dispatch):
    def __call__(self, command: Command) -> Command:
        fn = self.target(command)
        return command if fn is None else fn(command)


def _as_is(command: Command) -> Command:
    """The parse of a handler that declares none: the command as decoded."""
    return command


def _flatten(
    fn: Callable | None,
) -> tuple[Callable | None, dict[str, Callable], dict[str, type | None]]:
    if isinstance(fn, _Dispatch):
        return fn.base, dict(fn.by_type), dict(fn.declared)
    return fn, {}, {}


def message_types(
    aggregate: Aggregate,
) -> tuple[dict[str, type | None], dict[str, type | None]]:
    """The command and event types the aggregate's handlers add (name -> declared Struct or
    None), beside those the aggregate declares itself: the topology lists both."""
    decide, apply = aggregate.decide, aggregate.apply
    commands = decide.declared if isinstance(decide, _Decide) else {}
    events = apply.declared if isinstance(apply, _Apply) else {}
    return dict(commands), dict(events)


def _with_typed_state(fn: Callable, aggregate: Aggregate) -> Callable:
    """A handler's decide or apply seeing the state as the aggregate's declared state type.

    The base functions of a typed aggregate convert a state loaded from the store (JSON); a
    handler's are called around them, so without this they would see a dict after a restore
    and a Struct otherwise. wraps keeps the handler's name and source for the topology.
    """
    typed = aggregate.typed
    if typed is None or typed.state_type is None:
        return fn
    to_state = typed.state

    @functools.wraps(fn)
    def typed_state(state: State, value: Any) -> Any:
        return fn(to_state(state) if type(state) is dict else state, value)

    return typed_state


def extend(aggregate: Aggregate, *handlers: Handler) -> Aggregate:
    """The aggregate with extra command types; the base decide/apply see everything else.

    A command type or event type handled twice is an error naming it: two handlers silently
    shadowing each other would make the outcome depend on the load order.
    """
    base_decide, decides, commands = _flatten(aggregate.decide)
    base_apply, applies, events = _flatten(aggregate.apply)
    base_parse, parses, _ = _flatten(aggregate.parse)
    versions = dict(aggregate.event_versions)
    upcasters = dict(aggregate.upcasters)
    for handler in handlers:
        if handler.command in decides:
            raise PluginError(f"command type {handler.command!r} is handled twice")
        decides[handler.command] = _with_typed_state(handler.decide, aggregate)
        commands[handler.command] = handler.command_type
        parses[handler.command] = handler.parse or _as_is
        for event_type, fn in handler.apply.items():
            if event_type in applies:
                raise PluginError(f"event type {event_type!r} is applied by two handlers")
            applies[event_type] = _with_typed_state(fn, aggregate)
            events[event_type] = handler.event_types.get(event_type)
        versions.update(handler.event_versions)
        upcasters.update(handler.upcasters)
    if not handlers:
        return aggregate
    field_name = handlers[0].type_field
    return replace(
        aggregate,
        decide=_Decide(base_decide, decides, field_name, commands),
        apply=_Apply(base_apply, applies, TYPE_FIELD, events),
        parse=_Parse(base_parse, parses, field_name),
        event_versions=versions,
        upcasters=upcasters,
    )


@dataclass(frozen=True)
class Plugin:
    """What an installed package adds to a service.

    `aggregates` limits the plugin to services whose aggregate has one of these names (empty:
    every service in the environment), so one image can hold several services safely.
    """

    name: str
    projections: Sequence[Projection] = ()
    handlers: Sequence[Handler] = ()
    aggregates: tuple[str, ...] = ()
    description: str = field(default="", compare=False)

    def applies_to(self, aggregate_name: str) -> bool:
        return not self.aggregates or aggregate_name in self.aggregates


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin as loaded from its entry point, for logs, /v1/stats and the topology."""

    name: str
    entry_point: str
    distribution: str
    version: str
    plugin: Plugin

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entry_point": self.entry_point,
            "distribution": self.distribution,
            "version": self.version,
            "projections": [p.name for p in self.plugin.projections],
            "handlers": [h.command for h in self.plugin.handlers],
        }


def entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def load_entry_point(ep: importlib.metadata.EntryPoint) -> LoadedPlugin:
    """Import one entry point; any failure becomes a PluginError naming it."""
    dist = ep.dist.name if ep.dist is not None else "?"
    version = ep.dist.version if ep.dist is not None else "?"
    where = f"plugin {ep.name!r} (entry point {ep.value!r} of {dist} {version})"
    try:
        obj = ep.load()
        plugin = obj() if callable(obj) and not isinstance(obj, Plugin) else obj
    except Exception as exc:
        raise PluginError(f"{where} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(plugin, Plugin):
        raise PluginError(f"{where} is a {type(plugin).__name__}, not an enhydra.plugins.Plugin")
    return LoadedPlugin(ep.name, ep.value, dist, version, plugin)


def load_plugins(eps: Iterable[importlib.metadata.EntryPoint] | None = None) -> list[LoadedPlugin]:
    """Every installed plugin (the `enhydra.handlers` entry points), or those of `eps`.

    Which of them apply to a service, and what they add to it, is `enhydra.spec.resolve`'s job.
    """
    return [load_entry_point(ep) for ep in (entry_points() if eps is None else eps)]
