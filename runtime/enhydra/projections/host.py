"""Runs a service's projections (its own and its plugins') beside the aggregate's engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from enhydra.aggregate import Aggregate
from enhydra.errors.uncaught import EXIT_SHUTDOWN_CLIENT
from enhydra.projections.engine import ProjectionEngine
from enhydra.projections.model import Projection
from enhydra.settings import Settings
from enhydra.sql.model import SqlProjection

Shutdown = Callable[..., None]  # (exit_code, message, **context): stop this instance


def engine_for(settings: Settings, projection: Any, events_topic: str, **options: Any) -> Any:
    """The engine of a projection: RocksDB for a Projection, PostgreSQL for a SqlProjection
    (imported only then: it needs the enhydra[postgres] extra)."""
    if isinstance(projection, SqlProjection):
        from enhydra.sql.engine import SqlProjectionEngine

        return SqlProjectionEngine(settings, projection, events_topic, **options)
    return ProjectionEngine(settings, projection, events_topic, **options)


class ProjectionHost:
    """Starts one engine per projection; a failing projection stops the instance.

    A read model that silently stopped would keep answering queries with old data, so a failure
    in `project` is treated like a failure of the stream worker: the instance exits with 1.
    """

    def __init__(
        self,
        settings: Settings,
        projections: Sequence[tuple[Projection, str | None]],
        events_topic: str,
        *,
        transient: tuple[type[BaseException], ...] = (),
        shutdown: Shutdown,
        aggregate: Aggregate | None = None,
    ) -> None:
        self.settings = settings
        self.aggregate = aggregate  # whose events: their versions and upcasters
        self.projections = projections
        self.events_topic = events_topic
        self.transient = transient
        self.shutdown = shutdown
        self.engines: dict[str, ProjectionEngine] = {}

    async def start(self) -> None:
        for projection, plugin in self.projections:
            engine = engine_for(
                self.settings,
                projection,
                self.events_topic,
                plugin=plugin,
                transient=self.transient,
                aggregate=self.aggregate,
            )
            engine.on_failure = self._failed(projection.name)
            self.engines[projection.name] = engine
            await engine.start()

    def _failed(self, name: str) -> Callable[[BaseException], Any]:
        def on_failure(error: BaseException) -> None:
            self.shutdown(
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
