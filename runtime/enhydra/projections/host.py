"""Runs a service's projections (its own and its plugins') beside the aggregate's engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enhydra.errors.uncaught import EXIT_SHUTDOWN_CLIENT
from enhydra.logs import get_logger
from enhydra.plugins import all_projections
from enhydra.projections.engine import ProjectionEngine

if TYPE_CHECKING:
    from enhydra.service import Service

log = get_logger("enhydra.projections")


class ProjectionHost:
    """Starts one engine per projection; a failing projection stops the instance.

    A read model that silently stopped would keep answering queries with old data, so a failure
    in `project` is treated like a failure of the stream worker: the instance exits with 1.
    """

    def __init__(self, service: Service) -> None:
        self.service = service
        self.engines: dict[str, ProjectionEngine] = {}

    async def start(self) -> None:
        svc = self.service
        events_topic = svc.bound.events_topic
        for projection, plugin in all_projections(svc):
            engine = ProjectionEngine(svc.settings, projection, events_topic, plugin=plugin)
            engine.on_failure = self._failed(projection.name)
            self.engines[projection.name] = engine
            await engine.start()

    def _failed(self, name: str):
        def on_failure(error: BaseException) -> None:
            self.service.shutdown(
                EXIT_SHUTDOWN_CLIENT,
                "projection failed; shutting down this instance",
                projection=name,
                error=f"{type(error).__name__}: {error}",
            )

        return on_failure

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()

    def stores(self) -> dict[str, ProjectionEngine]:
        """Projection name -> engine, for queries."""
        return dict(self.engines)
