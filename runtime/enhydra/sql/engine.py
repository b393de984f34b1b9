"""A SQL projection's engine: the task runner with `project` as its step and SqlCommit as
its commit unit (commit.py). Declared and hosted like a RocksDB projection
(projections/engine.py): its own consumer group, balanced among the instances.

The task's RocksDB store stays empty; it only mirrors each partition's position, so the
runner's lags, watchdog and status read as for any other task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from enhydra.aggregate import Aggregate
from enhydra.contracts.headers import EVENT_VERSION_HEADER, header
from enhydra.contracts.partitioner import partition_for
from enhydra.evolution import is_unversioned, reader, refuse
from enhydra.kafka.topics import TopicSpec
from enhydra.projections.engine import read_model_runner
from enhydra.runner.batch import StepOutput
from enhydra.runner.checkpoint import Checkpoint
from enhydra.runner.runner import TaskRunner
from enhydra.runner.tasks import Task
from enhydra.settings import Settings
from enhydra.sql.commit import EventRows, SqlCommit
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.model import SqlProjection


class SqlStep:
    """`project` over one partition's events: the rows each event changes (pure)."""

    counters = ("ignored", "events")
    # The step reads no state, so nothing it reads can be unpersisted: the runner computes
    # the next batch while the previous one's transaction flies (positions stay exact: each
    # transaction moves them from where the one before left them; commit.py).
    reads_unpersisted = True

    def __init__(
        self,
        projection: SqlProjection,
        transient: tuple[type[BaseException], ...] = (),
        aggregate: Aggregate | None = None,
    ) -> None:
        self.projection = projection
        self.transient = transient
        self.read = reader(aggregate) if aggregate is not None else None

    def new_cache(self) -> None:
        return None

    def __call__(self, task: Task, records: list[Any], give_up: Mapping[int, int]) -> StepOutput:
        project, check, read = self.projection.project, self.projection.check, self.read
        loads, transient = orjson.loads, self.transient
        rows: list[EventRows] = []
        append = rows.append
        ignored = 0
        last = -1
        interrupted = None
        for record in records:
            last = record.offset
            event = loads(record.value) if record.key and record.value else None
            if type(event) is not dict:
                ignored += 1  # nothing to fold: no key, or not a JSON object
                continue
            headers = record.headers
            version = header(headers, EVENT_VERSION_HEADER) if headers else None
            if read is not None:
                event = read(event, version)
            elif not is_unversioned(version):
                raise refuse(event, version)
            try:
                ops = check(project(record.key.decode("utf-8", "replace"), event))
            except transient as exc:
                if record.offset in give_up:
                    raise
                interrupted, last = (record.offset, exc), record.offset - 1
                break
            append(EventRows(record, ops))
        return StepOutput(
            outputs={},
            puts=[],
            last_offset=last,
            counts={"ignored": ignored, "events": len(rows)},
            interrupted=interrupted,
            rows=rows,
        )


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
        self.database = database or DatabaseSettings.from_env()
        self.method = method
        self.sql: SqlCommit | None = None
        super().__init__(
            settings,
            step=SqlStep(projection, transient, aggregate),
            **read_model_runner(settings, projection, events_topic, plugin),
        )

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
