"""A service as declared, and what it resolves to: plain frozen data, no I/O.

`Service(...)` in user code is a declaration: the aggregate, its projections, error handlers,
snapshot hooks and settings defaults. `ServiceSpec` freezes it. `resolve` combines a spec, the
effective settings and the plugins found installed into the `ResolvedService` the runtime runs:
the aggregate extended by plugins' handlers, every projection with its origin, the topic names
of this application. Resolving is pure, so tests, `enhydra topology` and the runtime all see the
same service, and nothing mutates the user's declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from enhydra.aggregate import Aggregate, BoundAggregate
from enhydra.errors.policies import ErrorPolicies, Handler
from enhydra.errors.uncaught import UncaughtHandler
from enhydra.plugins import LoadedPlugin, PluginError, extend
from enhydra.projections.model import Projection
from enhydra.reactions.model import Reaction
from enhydra.sagas.model import Saga
from enhydra.settings import Settings

SnapshotHook = Callable[[str, dict[str, Any]], Any]  # (phase, info), sync or async


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class ServiceSpec:
    """What the user's code declares about a service."""

    app_id: str
    aggregate: Aggregate
    projections: tuple[Projection, ...] = ()
    reactions: tuple[Reaction, ...] = ()  # other services' events -> commands (reactions/)
    sagas: tuple[Saga, ...] = ()  # state per correlation id, with deadlines (sagas/)
    # JSON Schemas of key/commands/events/state, compared by `enhydra topology check`.
    schemas: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))
    transient_errors: tuple[type[BaseException], ...] = ()
    on_deserialization_error: Handler | None = None
    on_processing_error: Handler | None = None
    on_production_error: Handler | None = None
    on_uncaught_error: UncaughtHandler | None = None
    snapshot_hooks: tuple[SnapshotHook, ...] = ()
    # Code defaults of ENHYDRA_* settings; the environment overrides them at start.
    defaults: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))

    def __post_init__(self) -> None:
        object.__setattr__(self, "schemas", _frozen(self.schemas))
        object.__setattr__(self, "defaults", _frozen(self.defaults))

    def settings(self, env: Mapping[str, str] | None = None) -> Settings:
        """The effective settings: these defaults overridden by ENHYDRA_* variables."""
        return Settings.from_env(env, app_id=self.app_id, **dict(self.defaults))


@dataclass(frozen=True)
class ResolvedService:
    """A spec with its settings and plugins applied: what one instance runs."""

    spec: ServiceSpec
    settings: Settings
    aggregate: Aggregate  # the declared aggregate, extended by plugins' handlers
    projections: tuple[tuple[Projection, str | None], ...]  # (projection, plugin or None)
    plugins: tuple[LoadedPlugin, ...]

    @property
    def app_id(self) -> str:
        return self.settings.app_id

    @property
    def bound(self) -> BoundAggregate:
        """The aggregate with this application's topic names (settings may redirect input)."""
        bound = self.aggregate.bind(self.settings.app_id)
        if self.settings.commands_topic:
            bound = dataclasses.replace(bound, commands_topic=self.settings.commands_topic)
        return bound

    @property
    def policies(self) -> ErrorPolicies:
        """Record-level error policies: callables given in code win over settings."""
        s, spec = self.settings, self.spec
        return ErrorPolicies(
            spec.on_deserialization_error or s.deserialization_exception_handler,
            spec.on_processing_error or s.processing_exception_handler,
            spec.on_production_error or s.production_exception_handler,
        )

    @property
    def schemas(self) -> Mapping[str, Any]:
        return self.spec.schemas

    @property
    def reactions(self) -> tuple[Reaction, ...]:
        return self.spec.reactions

    @property
    def sagas(self) -> tuple[Saga, ...]:
        return self.spec.sagas


def resolve(
    spec: ServiceSpec, settings: Settings, plugins: Sequence[LoadedPlugin] = ()
) -> ResolvedService:
    """The service an instance runs: `spec` with `settings` and the plugins that apply to it.

    Raises PluginError when two stores would answer to one name at /v1/stores/<name>.
    """
    name = spec.aggregate.name
    applying = tuple(lp for lp in plugins if lp.plugin.applies_to(name))
    handlers = [h for lp in applying for h in lp.plugin.handlers]
    aggregate = extend(spec.aggregate, *handlers) if handlers else spec.aggregate
    projections = tuple(
        [(p, None) for p in spec.projections]
        + [(p, lp.name) for lp in applying for p in lp.plugin.projections]
    )
    seen = {name: "the aggregate"}
    for projection, plugin in projections:
        origin = f"plugin {plugin!r}" if plugin else "the service"
        if projection.name in seen:
            raise PluginError(
                f"projection {projection.name!r} of {origin} has the same name as "
                f"{seen[projection.name]}; store names must be unique"
            )
        seen[projection.name] = f"projection {projection.name!r} of {origin}"
    for reaction in spec.reactions:  # its changelog topic is named like a store's
        if reaction.name in seen:
            raise PluginError(
                f"reaction {reaction.name!r} has the same name as {seen[reaction.name]}; "
                "names of the aggregate, projections and reactions must be unique"
            )
        seen[reaction.name] = f"reaction {reaction.name!r}"
    for saga in spec.sagas:  # so is a saga's, and its forwarders are reactions
        for name in (saga.name, *(f.name for f in saga.forwarders())):
            if name in seen:
                raise PluginError(
                    f"saga {saga.name!r}: {name!r} has the same name as {seen[name]}; names "
                    "of the aggregate, projections, reactions and sagas must be unique"
                )
            seen[name] = f"saga {saga.name!r}"
    return ResolvedService(spec, settings, aggregate, projections, applying)
