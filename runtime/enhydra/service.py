"""Service: wires the settings, logging, a faust App, the processing engine and the web server.

faust-streaming provides what it does well here: the worker lifecycle (signals, ordered start
and stop of services, a clean exit) and the app container. Records do not go through faust's
per-message agent path: the engine consumes and processes them in batches (see
processing/engine.py for why that ordering is safe).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import faust
from aiohttp import web
from faust.app.base import BootStrategy
from mode import Service as ModeService

from enhydra.aggregate import Aggregate
from enhydra.logs import configure_logging, get_logger
from enhydra.processing.engine import Engine
from enhydra.query.http import build_app
from enhydra.settings import Settings

log = get_logger("enhydra.service")

EXIT_FAILURE = 1


class _BootStrategy(BootStrategy):
    # The engine owns the Kafka clients; faust's consumer would join the group a second time.
    enable_kafka = False


class _App(faust.App):
    BootStrategy = _BootStrategy


class _EngineService(ModeService):
    """Starts the engine with the app and stops it (gracefully) with the app."""

    engine: Engine

    async def on_start(self) -> None:
        await self.engine.start()

    async def on_stop(self) -> None:
        await self.engine.stop()


class _WebService(ModeService):
    """The instance's aiohttp server; it starts before the engine so probes answer early."""

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

    def __init__(self, app_id: str, aggregate: Aggregate, **settings: Any) -> None:
        self.aggregate = aggregate
        self._defaults = {"app_id": app_id, **settings}
        self._settings: Settings | None = None
        self.engine: Engine | None = None
        self.app: faust.App | None = None

    @property
    def settings(self) -> Settings:
        """The effective settings, read from the environment on first use."""
        if self._settings is None:
            self._settings = Settings.from_env(**dict(self._defaults))
        return self._settings

    @property
    def bound(self):
        return self.aggregate.bind(self.settings.app_id)

    def build(self) -> faust.App:
        """Create the faust App with the engine and the web server attached."""
        s = self.settings
        s.store_dir.mkdir(parents=True, exist_ok=True)
        engine = self.engine = Engine(s, self.bound)
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
        app.web_server(_WebService(build_app(engine, s.instance_id), s.web_host, s.web_port))
        app.service(
            type("EnhydraEngine", (_EngineService,), {"engine": engine, "__module__": __name__})
        )
        self.app = app
        return app

    def run(self) -> None:
        """Run a worker until SIGTERM/SIGINT; exit non-zero if processing failed."""
        s = self.settings
        configure_logging(
            fmt=s.log_format,
            level=s.log_level,
            static={"app": s.app_id, "instance": s.instance_id},
        )
        app = self.build()
        worker = faust.Worker(app, quiet=True, loglevel=s.log_level.upper(), override_logging=False)
        worker.spinner = None  # it writes terminal escapes into the JSON log stream
        assert self.engine is not None

        stopping: list[asyncio.Future[None]] = []

        def stop_on_failure(_exc: BaseException) -> None:
            stopping.append(asyncio.ensure_future(worker.stop()))

        self.engine.on_failure = stop_on_failure
        log.info(
            "starting",
            app_id=s.app_id,
            instance=s.instance_id,
            bootstrap=s.bootstrap_servers,
            store=self.aggregate.name,
            web=s.advertised_url,
            tags=s.client_tags,
        )
        code = 0
        try:
            worker.execute_from_commandline()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else EXIT_FAILURE
        if self.engine.failure is not None:
            code = EXIT_FAILURE
        log.info("stopped", exit_code=code)
        sys.exit(code)
