"""Service: wires the settings, logging, a faust App, the processing engine and the web server.

faust-streaming provides what it does well here: the worker lifecycle (signals, ordered start
and stop of services, a clean exit) and the app container. Records do not go through faust's
per-message agent path: the engine consumes and processes them in batches (see
processing/engine.py for why that ordering is safe).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import faust
from aiohttp import web
from faust.app.base import BootStrategy
from mode import Service as ModeService

from enhydra.aggregate import Aggregate, BoundAggregate
from enhydra.control.channel import SHUTDOWN_APPLICATION, ControlChannel
from enhydra.errors.policies import ErrorPolicies, Handler, UncaughtPolicy
from enhydra.errors.uncaught import (
    EXIT_CANNOT_START,
    EXIT_SHUTDOWN_APPLICATION,
    EXIT_SHUTDOWN_CLIENT,
    RestartBudget,
    UncaughtDecider,
    UncaughtHandler,
)
from enhydra.kafka.clients import check_access
from enhydra.kafka.errors import KafkaAccessError
from enhydra.kafka.topics import TopicError
from enhydra.logs import configure_logging, get_logger
from enhydra.plugins import LoadedPlugin, PluginError, load_plugins
from enhydra.processing.engine import Engine
from enhydra.projections.host import ProjectionHost
from enhydra.projections.model import Projection
from enhydra.query.http import AdminRoute, build_app
from enhydra.settings import Settings, SettingsError, unknown_variables
from enhydra.snapshots.live import SNAPSHOT_CREATE, LiveSnapshots, new_snapshot_id
from enhydra.snapshots.live import Hook as SnapshotHook

log = get_logger("enhydra.service")
# mode logs each service's "Starting..."/"Stopping..." at INFO under the class's module name;
# under its own logger, that chatter stays below the service's log level (logs.py).
_LIFECYCLE_LOGGER = logging.getLogger("mode.enhydra")


class _BootStrategy(BootStrategy):
    # The engine owns the Kafka clients; faust's consumer would join the group a second time.
    enable_kafka = False


class _App(faust.App):
    BootStrategy = _BootStrategy
    logger = _LIFECYCLE_LOGGER


def settle_heap() -> None:
    """Put everything start-up created out of the garbage collector's reach (gc.freeze).

    A full collection otherwise walks every module, class and setting of the process while
    the engine waits: measured 30-65 ms pauses about once a second under load, the largest
    part of the p99 latency. Objects made later are collected as before, less often.
    """
    gc.collect()
    gc.freeze()
    # A batch allocates tens of thousands of short-lived containers; with the default
    # threshold (700) many survive into older generations and are scanned again and again.
    gc.set_threshold(50_000, 20, 20)


class _Supervisor(ModeService):
    """Runs the engine under the uncaught-exception policy, and listens to the control topic.

    The engine is replaced, not restarted in place: a fresh one rejoins the group and restores
    from its local checkpoints, so no half-updated in-memory state survives a crash.
    """

    owner: Service
    logger = _LIFECYCLE_LOGGER

    async def on_start(self) -> None:
        try:
            await self._start()
        except (KafkaAccessError, TopicError) as exc:
            fields = exc.fields() if isinstance(exc, KafkaAccessError) else {}
            self.owner.shutdown(EXIT_CANNOT_START, str(exc), level="error", **fields)

    async def _start(self) -> None:
        svc = self.owner
        s = svc.settings
        self._handling: list[asyncio.Future[None]] = []
        self.decider = UncaughtDecider(
            svc.on_uncaught_error or s.uncaught_exception_handler,
            RestartBudget(s.max_worker_replacements, s.worker_replacement_window_s),
            UncaughtPolicy(s.uncaught_escalation),
        )
        engine = svc.new_engine()
        engine.on_failure = self._on_failure
        svc.engine = engine
        await engine.start()  # creates the topics, the control topic among them
        self.control = ControlChannel(s.connection, s.app_id, s.instance_id, self._on_control)
        svc.snapshots = LiveSnapshots(svc, self.control.send)
        await self.control.start()
        svc.snapshots.start()
        if s.snapshot_interval_s:
            self._handling.append(asyncio.ensure_future(svc.snapshots.periodic()))
        svc.projection_host = ProjectionHost(svc)  # the service's and its plugins' projections
        await svc.projection_host.start()
        settle_heap()

    async def on_stop(self) -> None:
        for pending in self._handling:
            pending.cancel()
        if self.owner.projection_host is not None:
            await self.owner.projection_host.stop()
        if self.owner.snapshots is not None:
            await self.owner.snapshots.stop()
        if self.owner.engine is not None:
            await self.owner.engine.stop()
        if getattr(self, "control", None) is not None:
            await self.control.stop()

    def _on_failure(self, error: BaseException) -> None:
        self._handling.append(asyncio.ensure_future(self._handle(error)))

    async def _handle(self, error: BaseException) -> None:
        svc = self.owner
        policy = self.decider.decide(error)
        log.error(
            "stream worker died",
            error=f"{type(error).__name__}: {error}",
            policy=policy.upper(),
            replacements=self.decider.budget.used,
            max_replacements=self.decider.budget.max_restarts,
        )
        if policy is UncaughtPolicy.REPLACE_WORKER:
            old = svc.engine
            if old is not None:
                await old.stop()
            engine = svc.new_engine()
            engine.on_failure = self._on_failure
            svc.engine = engine
            await engine.start()
            log.warning("stream worker replaced", replacements=self.decider.budget.used)
            return
        if policy is UncaughtPolicy.SHUTDOWN_APPLICATION:
            await self.control.send(SHUTDOWN_APPLICATION, reason=f"{type(error).__name__}: {error}")
            svc.shutdown(EXIT_SHUTDOWN_APPLICATION, "shutting down the whole application")
            return
        svc.shutdown(EXIT_SHUTDOWN_CLIENT, "shutting down this instance")

    async def _on_control(self, message: dict[str, Any]) -> None:
        if self.owner.snapshots is not None:
            await self.owner.snapshots.on_message(message)
        if message.get("type") == SHUTDOWN_APPLICATION:
            self.owner.shutdown(
                EXIT_SHUTDOWN_APPLICATION,
                "application shutdown requested",
                requested_by=message.get("origin"),
                reason=message.get("reason"),
            )


class _WebService(ModeService):
    """The instance's aiohttp server; it starts before the engine so probes answer early."""

    logger = _LIFECYCLE_LOGGER

    def __init__(self, app: web.Application, host: str, port: int, **kw: Any) -> None:
        super().__init__(**kw)
        self._app = app
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    async def on_start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        log.info("web server listening", host=self._host, port=self._port)

    async def on_stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


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
        schemas: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        self.aggregate = aggregate
        self.transient_errors = tuple(transient_errors)
        self._handlers = (on_deserialization_error, on_processing_error, on_production_error)
        self.on_uncaught_error = on_uncaught_error
        self._defaults = {"app_id": app_id, **settings}
        self._settings: Settings | None = None
        self.engine: Engine | None = None
        self.app: faust.App | None = None
        self.exit_code = 0
        self._stop_worker: Callable[[], None] | None = None
        # Read models built from the events topic (enhydra.projections); plugins add theirs.
        self.projections: list[Projection] = list(projections)
        # Declared JSON Schemas of key/commands/events/state, compared by `topology check`.
        self.schemas: dict[str, Any] = dict(schemas or {})
        self.plugins: list[LoadedPlugin] = []  # loaded from entry points when the service builds
        self.plugins_loaded = False
        self.projection_host: ProjectionHost | None = None
        self.snapshots: LiveSnapshots | None = None
        self._snapshot_hooks: list[SnapshotHook] = []
        # Extra (method, path, handler) HTTP endpoints behind ENHYDRA_ADMIN_TOKEN (query/http.py).
        self.admin_routes: list[AdminRoute] = [("POST", "/v1/admin/snapshots", self._snapshot_now)]

    def on_snapshot(self, hook: SnapshotHook) -> SnapshotHook:
        """Register `hook(phase, info)`, called "before" and "after" every live snapshot.

        Runs on the instance coordinating the snapshot. Raising in "before" cancels the
        snapshot (validation); "after" receives the cut and row count (upload, notify).
        """
        self._snapshot_hooks.append(hook)
        return hook

    async def _snapshot_now(self, request: web.Request) -> web.Response:
        """Take a consistent snapshot of the whole application now (returns its id at once).

        Body (optional JSON): {"storage": "<url>"}; default ENHYDRA_SNAPSHOT_STORAGE. Poll
        `enhydra snapshot list` or watch the log for "snapshot written".
        """
        body = await request.json() if request.can_read_body else {}
        storage = (body or {}).get("storage") or self.settings.snapshot_storage
        if not storage:
            return web.json_response(
                {"error": "no snapshot storage: set ENHYDRA_SNAPSHOT_STORAGE or pass storage"},
                status=400,
            )
        if self.snapshots is None:
            return web.json_response(
                {"error": "the worker is starting"}, status=503, headers={"Retry-After": "1"}
            )
        snapshot_id = new_snapshot_id(self.settings.app_id)
        await self.snapshots.send(SNAPSHOT_CREATE, id=snapshot_id, storage=storage)
        return web.json_response({"id": snapshot_id, "storage": storage}, status=202)

    async def run_snapshot_hooks(self, phase: str, info: dict[str, Any]) -> None:
        for hook in self._snapshot_hooks:
            result = hook(phase, info)
            if inspect.isawaitable(result):
                await result

    @property
    def settings(self) -> Settings:
        """The effective settings, read from the environment on first use."""
        if self._settings is None:
            self._settings = Settings.from_env(**dict(self._defaults))
        return self._settings

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
        s = self.settings
        given = self._handlers
        return ErrorPolicies(
            given[0] or s.deserialization_exception_handler,
            given[1] or s.processing_exception_handler,
            given[2] or s.production_exception_handler,
        )

    def new_engine(self) -> Engine:
        return Engine(
            self.settings, self.bound, policies=self.policies, transient=self.transient_errors
        )

    def shutdown(
        self, exit_code: int, message: str, *, level: str = "warning", **context: Any
    ) -> None:
        """Stop this instance cleanly with `exit_code` (the first reason given wins)."""
        if self.exit_code == 0:
            self.exit_code = exit_code
        getattr(log, level)(message, exit_code=exit_code, **context)
        if self._stop_worker is not None:
            self._stop_worker()

    def build(self) -> faust.App:
        """Create the faust App with the supervised engine and the web server attached."""
        s = self.settings
        load_plugins(self)  # raises PluginError naming a plugin that cannot load
        s.store_dir.mkdir(parents=True, exist_ok=True)
        app = _App(
            s.app_id,
            broker=f"kafka://{s.bootstrap_servers}",
            datadir=str(s.store_dir / "faust"),
            web_enabled=True,
            web_host=s.web_host,
            web_port=s.web_port,
            canonical_url=s.advertised_url,
            topic_partitions=s.partitions,
        )
        web_app = build_app(
            lambda: self.engine,
            s.instance_id,
            self.aggregate.name,
            projections=lambda: self.projection_host.stores() if self.projection_host else {},
            plugins=lambda: [p.describe() for p in self.plugins],
            settings=s,
            shutdown=lambda: self.shutdown(0, "shutdown requested over HTTP"),
            admin_routes=self.admin_routes,
        )
        app.web_server(_WebService(web_app, s.web_host, s.web_port))
        app.service(type("Enhydra", (_Supervisor,), {"owner": self, "__module__": __name__}))
        self.app = app
        return app

    def run(self) -> None:
        """Run a worker until SIGTERM/SIGINT or a shutdown policy; exit with its code."""
        try:
            s = self.settings
        except SettingsError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            sys.exit(EXIT_CANNOT_START)
        configure_logging(
            fmt=s.log_format,
            level=s.log_level,
            static={"app": s.app_id, "instance": s.instance_id},
        )
        for name, closest in unknown_variables():
            log.warning("unknown setting ignored", variable=name, did_you_mean=closest)
        try:
            app = self.build()
        except PluginError as exc:
            log.error("plugin failed to load", error=str(exc))
            sys.exit(EXIT_SHUTDOWN_CLIENT)
        worker = faust.Worker(app, quiet=True, loglevel=s.log_level.upper(), override_logging=False)
        worker.spinner = None  # it writes terminal escapes into the JSON log stream
        stopping: list[asyncio.Future[None]] = []
        self._stop_worker = lambda: stopping.append(asyncio.ensure_future(worker.stop()))
        log.info(
            "starting",
            app_id=s.app_id,
            instance=s.instance_id,
            kafka=s.connection.describe(),
            store=self.aggregate.name,
            web=s.advertised_url,
            tags=s.client_tags,
            plugins=[f"{p.name} ({p.distribution} {p.version})" for p in self.plugins],
        )
        try:  # fail in seconds with one line, not inside the worker with a traceback
            asyncio.run(check_access(s.connection))
        except KafkaAccessError as exc:
            log.error(exc.what, **exc.fields())
            sys.exit(EXIT_CANNOT_START)
        code = 0
        try:
            worker.execute_from_commandline()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else EXIT_SHUTDOWN_CLIENT
        code = self.exit_code or code
        log.info("stopped", exit_code=code)
        sys.exit(code)
