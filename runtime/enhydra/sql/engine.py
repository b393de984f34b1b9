"""A SQL projection's engine: the task runner with `project` as its step and SqlCommit as
its commit unit (commit.py). Declared and hosted like a RocksDB projection
(projections/engine.py): its own consumer group, balanced among the instances.

The task's RocksDB store stays empty; it only mirrors each partition's position, so the
runner's lags, watchdog and status read as for any other task.
"""

from __future__ import annotations

from typing import Any

from enhydra.aggregate import Aggregate
from enhydra.contracts.partitioner import partition_for
from enhydra.kafka.topics import TopicSpec
from enhydra.projections.engine import read_model_runner
from enhydra.runner.checkpoint import Checkpoint
from enhydra.runner.runner import TaskRunner
from enhydra.settings import Settings
from enhydra.sql.commit import SqlCommit
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.fold import SqlStep
from enhydra.sql.model import SqlProjection


class SqlProjectionEngine(TaskRunner):
    """Builds one SQL projection's tables from the events topic, for this instance's partitions."""

    label = "sql projection"

    def __init__(
        self,
        settings: Settings,
        projection: SqlProjection,
        events_topic: str,
        *,
        database: DatabaseSettings | None = None,
        plugin: str | None = None,
        transient: tuple[type[BaseException], ...] = (),
        aggregate: Aggregate | None = None,
        method: str = "copy",
    ) -> None:
        self.projection = projection
        self.events_topic = events_topic
        self.plugin = plugin
        self._database = database
        self.method = method
        self.sql: SqlCommit | None = None
        super().__init__(
            settings,
            step=SqlStep(projection, transient, aggregate),
            **read_model_runner(settings, projection, events_topic, plugin),
        )

    @property
    def database(self) -> DatabaseSettings:
        """ENHYDRA_DATABASE_* as read when first needed (the start): the engine built for its
        topics alone (`enhydra topology check --live`) needs no database setting."""
        if self._database is None:
            self._database = DatabaseSettings.from_env()
        return self._database

    def topic_specs(self) -> list[TopicSpec]:
        s = self.settings
        return [
            TopicSpec(self.events_topic, s.partitions, history=True),
            TopicSpec(self.changelog_topic, s.partitions, compacted=True),  # stays empty
            TopicSpec(s.dlq_topic, s.partitions, history=True),
        ]

    def _new_checkpoint(self) -> Checkpoint:
        self.sql = SqlCommit(
            self.settings,
            self.database,
            self.projection,
            input_topic=self.input_topic,
            client_id=self.client_id,
            method=self.method,
        )
        return self.sql

    def read(self, key: str) -> tuple[str, int, Any]:
        """Key lookups over HTTP serve RocksDB projections only: this one lives in PostgreSQL
        (query its tables there). Answered as unavailable, never as a missing key."""
        return "unavailable", partition_for(key.encode("utf-8"), self.settings.partitions), None

    def describe(self) -> dict[str, object]:
        sql = self.sql
        return {
            "plugin": self.plugin,
            "kind": "sql",
            "database": self.database.describe(),
            "ready": self.registry.ready,
            "waiting": sql.waiting if sql is not None else None,
            "partitions": {str(p): t.status.value for p, t in sorted(self.registry.tasks.items())},
            **self.stats,
            **(sql.stats if sql is not None else {}),
        }
