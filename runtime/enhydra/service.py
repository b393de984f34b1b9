"""Service: how a user declares an event-sourced service, and the entry point that runs it.

    service = Service("ledger", accounts, num_standby_replicas=1)
    service.run()          # or: enhydra run ledger.service:service

A Service is a declaration (spec.py freezes it as a ServiceSpec); `resolved()` applies the
settings from the environment and the installed plugins; `run()` hands the resolved service to
the runtime container (runtime.py), which owns everything that runs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from enhydra import tracing
from enhydra.aggregate import Aggregate, BoundAggregate
from enhydra.errors.policies import ErrorPolicies, Handler
from enhydra.errors.uncaught import EXIT_CANNOT_START, EXIT_SHUTDOWN_CLIENT, UncaughtHandler
from enhydra.kafka.noise import ConnectionNoise
from enhydra.logs import configure_logging, get_logger
from enhydra.plugins import LoadedPlugin, PluginError, load_plugins
from enhydra.preflight import StartupConflict, check_web_port, claim_state_dir
from enhydra.projections.model import Projection
from enhydra.reactions.model import Reaction
from enhydra.sagas.model import Saga
from enhydra.settings import Settings, SettingsError, unknown_variables
from enhydra.spec import ResolvedService, ServiceSpec, SnapshotHook, resolve

log = get_logger("enhydra.service")


class Service:
    """An event-sourced service: one aggregate, its topics, its store, its HTTP API.

    Settings passed here are the service's defaults; ENHYDRA_* environment variables override
    them when the service starts, so one image runs anywhere.
    """

    def __init__(
        self,
        app_id: str,
        aggregate: Aggregate,
        *,
        transient_errors: tuple[type[BaseException], ...] = (),
        on_deserialization_error: Handler | None = None,
        on_processing_error: Handler | None = None,
        on_production_error: Handler | None = None,
        on_uncaught_error: UncaughtHandler | None = None,
        projections: Sequence[Projection] = (),
        reactions: Sequence[Reaction] = (),
        sagas: Sequence[Saga] = (),
        schemas: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        self.app_id = app_id
        self.aggregate = aggregate
        self.transient_errors = tuple(transient_errors)
        self.on_deserialization_error = on_deserialization_error
        self.on_processing_error = on_processing_error
        self.on_production_error = on_production_error
        self.on_uncaught_error = on_uncaught_error
        # Read models built from the events topic (enhydra.projections); plugins add theirs.
        self.projections: list[Projection] = list(projections)
        # Commands made from other services' events (enhydra.reactions).
        self.reactions: list[Reaction] = list(reactions)
        # Process managers over several services' events, with deadlines (enhydra.sagas).
        self.sagas: list[Saga] = list(sagas)
        # Declared JSON Schemas of key/commands/events/state, compared by `topology check`.
        self.schemas: dict[str, Any] = dict(schemas or {})
        self.defaults: dict[str, Any] = dict(settings)
        self.snapshot_hooks: list[SnapshotHook] = []
        self._settings: Settings | None = None
        self._resolved: ResolvedService | None = None

    def on_snapshot(self, hook: SnapshotHook) -> SnapshotHook:
        """Register `hook(phase, info)`, called "before" and "after" every live snapshot.

        Runs on the instance coordinating the snapshot. Raising in "before" cancels the
        snapshot (validation); "after" receives the cut and row count (upload, notify).
        """
        self.snapshot_hooks.append(hook)
        self._resolved = None
        return hook

    @property
    def spec(self) -> ServiceSpec:
        """This declaration, frozen."""
        return ServiceSpec(
            app_id=self.app_id,
            aggregate=self.aggregate,
            projections=tuple(self.projections),
            reactions=tuple(self.reactions),
            sagas=tuple(self.sagas),
            schemas=self.schemas,
            transient_errors=self.transient_errors,
            on_deserialization_error=self.on_deserialization_error,
            on_processing_error=self.on_processing_error,
            on_production_error=self.on_production_error,
            on_uncaught_error=self.on_uncaught_error,
            snapshot_hooks=tuple(self.snapshot_hooks),
            defaults=self.defaults,
        )

    @property
    def settings(self) -> Settings:
        """The effective settings, read from the environment on first use."""
        if self._settings is None:
            self._settings = self.spec.settings()
        return self._settings

    def resolved(self, plugins: Sequence[LoadedPlugin] | None = None) -> ResolvedService:
        """The service with its settings and plugins: installed ones unless `plugins` is given.

        The installed plugins are loaded once; a plugin that cannot load raises PluginError.
        """
        if plugins is not None:
            return resolve(self.spec, self.settings, plugins)
        if self._resolved is None:
            self._resolved = resolve(self.spec, self.settings, load_plugins())
        return self._resolved

    @property
    def plugins(self) -> tuple[LoadedPlugin, ...]:
        return self.resolved().plugins

    @property
    def bound(self) -> BoundAggregate:
        """The aggregate with this application's topic names (settings may redirect input)."""
        return resolve(self.spec, self.settings).bound

    @property
    def policies(self) -> ErrorPolicies:
        """Record-level error policies: callables given in code win over settings."""
        return resolve(self.spec, self.settings).policies

    def run(self) -> None:
        """Run a worker until SIGTERM/SIGINT or a shutdown policy; exit with its code."""
        from enhydra.runtime import Runtime

        try:
            s = self.settings
        except SettingsError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            sys.exit(EXIT_CANNOT_START)
        configure_logging(
            fmt=s.log_format,
            level=s.log_level,
            static={"app": s.app_id, "instance": s.instance_id},
            filters=[ConnectionNoise()],  # a broker outage: a few lines a minute, not thousands
        )
        try:  # OTEL_TRACES_EXPORTER asks for what cannot run: one line, before anything starts
            traced = tracing.current(s.app_id)
        except tracing.TracingError as exc:
            log.error("tracing cannot start", error=str(exc), exit_code=EXIT_CANNOT_START)
            sys.exit(EXIT_CANNOT_START)
        if traced is not None:
            log.info("tracing on", exporters=list(tracing.exporters()))
        for name, closest in unknown_variables():
            log.warning("unknown setting ignored", variable=name, did_you_mean=closest)
        try:
            resolved = self.resolved()
        except PluginError as exc:
            log.error("plugin failed to load", error=str(exc))
            sys.exit(EXIT_SHUTDOWN_CLIENT)
        log.info(
            "starting",
            app_id=s.app_id,
            instance=s.instance_id,
            kafka=s.connection.describe(),
            store=self.aggregate.name,
            web=s.advertised_url,
            tags=s.client_tags,
            plugins=[f"{p.name} ({p.distribution} {p.version})" for p in resolved.plugins],
        )
        try:  # another instance on this folder or port: one line now, not a traceback later
            claim = claim_state_dir(s.store_dir, s.instance_id)
            check_web_port(s.web_host, s.web_port)
        except StartupConflict as exc:
            log.error(exc.what, setting=exc.setting, fix=exc.fix, exit_code=EXIT_CANNOT_START)
            sys.exit(EXIT_CANNOT_START)
        try:
            code = Runtime(resolved).run()
        finally:
            claim.release()
        log.info("stopped", exit_code=code)
        sys.exit(code)
