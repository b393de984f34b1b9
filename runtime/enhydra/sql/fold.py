"""A SQL projection's fold: `project` over one partition's events, the rows each changes.

Pure, and importable where only orjson is (and psycopg is not needed): the live engine
(engine.py), the rebuild (rebuild.py) and the backfill's executors (spark/sql_sink.py) fold
with the same step, so the tables they fill are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from enhydra.contracts.headers import EVENT_VERSION_HEADER, header
from enhydra.evolution import is_unversioned, reader, refuse
from enhydra.runner.batch import StepOutput
from enhydra.sql.model import Op, SqlProjection

if TYPE_CHECKING:
    from enhydra.aggregate import Aggregate
    from enhydra.runner.tasks import Task


@dataclass(slots=True)
class EventRows:
    """One event and the rows its `project` returned (what the step hands the commit unit)."""

    record: Any  # the Kafka record: offset, key, value, timestamp, headers
    ops: list[Op]


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
