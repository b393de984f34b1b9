"""A SQL projection's tables filled by the backfill: `project` on the executors, rows into
PostgreSQL, then the rebuild's swap (enhydra.sql.rebuild: one place for it).

    Rebuild.run(filler=...)     new tables in the rebuild's schema, its positions loaded
      filler: Spark reads [position, target) of each events partition, one task per
              partition in offset order; each task folds batches of events with the
              projection's SqlStep and writes each batch's rows with its partition's
              position in one transaction (writer.write_batch)
    then the rebuild catches up what the live writers folded meanwhile and swaps, so the live
    projection resumes exactly after the positions the backfill stored.

A task that fails and runs again (or a backfill run again) starts from the position stored
with its rows: nothing is written twice.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from enhydra.sql.config import DatabaseSettings
    from enhydra.sql.fold import SqlStep

BATCH_EVENTS = 5000
RESULT_DDL = "partition int, events long, refused long"


@dataclass(frozen=True)
class _Record:
    """What SqlStep reads of a Kafka record."""

    key: bytes | None
    value: bytes | None
    offset: int
    headers: list[tuple[str, bytes]]


class SqlRows:
    """mapInArrow: fold one task's events into rows and write them, batch by batch.

    Holds the libpq connection string (with the password, read on the driver): it travels to
    the executors in the task closure and is never logged.
    """

    def __init__(
        self,
        step: SqlStep,
        conninfo: str,
        search_path: tuple[str, str],
        key: str,
        topic: str,
        targets: dict[int, int],
        batch_events: int = BATCH_EVENTS,
    ) -> None:
        self.step = step
        self.conninfo = conninfo
        self.search_path = search_path
        self.key = key
        self.topic = topic
        self.targets = targets
        self.batch_events = batch_events

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        try:
            counts = loop.run_until_complete(self._write(batches))
        finally:
            loop.close()
        yield pa.RecordBatch.from_pydict(
            {
                "partition": list(counts),
                "events": [c[0] for c in counts.values()],
                "refused": [c[1] for c in counts.values()],
            },
            schema=pa.schema(
                [("partition", pa.int32()), ("events", pa.int64()), ("refused", pa.int64())]
            ),
        )

    async def _write(self, batches: Iterable[pa.RecordBatch]) -> dict[int, list[int]]:
        from psycopg import AsyncConnection, sql

        from enhydra.sql import writer

        counts: dict[int, list[int]] = {}
        async with await AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("SET search_path TO {}, {}").format(*map(sql.Identifier, self.search_path))
            )
            columns_of = await writer.table_columns(conn, self.step.projection.tables)
            direct = writer.DirectCopy()
            positions: dict[int, int] = {}
            pending: dict[int, list[_Record]] = {}

            async def flush(partition: int, end: int | None = None) -> None:
                records = pending.pop(partition, [])
                start = positions[partition]
                new = end if end is not None else (records[-1].offset + 1 if records else start)
                if new <= start:
                    return
                out = self.step(None, records, {})  # type: ignore[arg-type]
                refused = await writer.write_batch(
                    conn,
                    self.step.projection,
                    self.key,
                    self.topic,
                    {partition: (start, new)},
                    out.rows,
                    partial(_refused, self.step.projection.name, partition),
                    stored=columns_of,
                    direct=direct,
                )
                positions[partition] = new
                counts[partition][0] += len(out.rows)
                counts[partition][1] += refused

            for batch in batches:
                columns = batch.to_pydict()
                for i, partition in enumerate(columns["partition"]):
                    if partition not in positions:  # stored with the rows: a retry resumes
                        stored = await writer.load_positions(
                            conn, self.key, self.topic, [partition]
                        )
                        positions[partition] = stored[partition]
                        counts[partition] = [0, 0]
                    offset = columns["offset"][i]
                    if offset < positions[partition] or offset >= self.targets[partition]:
                        continue
                    headers = [(h["key"], h["value"]) for h in columns["headers"][i] or []]
                    queue = pending.setdefault(partition, [])
                    if queue and offset <= queue[-1].offset:
                        raise RuntimeError(
                            f"events partition {partition} reached the fold out of offset order"
                        )
                    queue.append(_Record(columns["key"][i], columns["value"][i], offset, headers))
                    if len(queue) >= self.batch_events:
                        await flush(partition)
            for partition in list(positions):  # the read covered [position, target): all of it
                await flush(partition, self.targets[partition])
        return counts


def _refused(projection: str, partition: int, event: Any, error: BaseException) -> None:
    """One line in the executor's log (its stderr, kept by Spark) per event whose rows the
    database refused; the driver prints how many."""
    from enhydra.sql.writer import first_line

    print(
        f"enhydra backfill: sql projection {projection}: the rows of events partition "
        f"{partition} offset {event.record.offset} were refused; skipped: {first_line(error)}",
        file=sys.stderr,
    )


async def fill_tables(
    spark: Any,
    read: Any,
    step: SqlStep,
    database: DatabaseSettings,
    search_path: tuple[str, str],
    key: str,
    topic: str,
    positions: dict[int, int],
    targets: dict[int, int],
    batch_events: int = BATCH_EVENTS,
) -> tuple[int, int]:
    """The filler of Rebuild.run: read [position, target) of each partition with `read(ranges)`
    (a DataFrame, one Spark partition per Kafka partition) and write its rows on the executors.
    Returns the events folded and the events whose rows the database refused."""
    from enhydra.spark.source import OffsetRange

    ranges = [
        OffsetRange(p, positions.get(p, 0), t)
        for p, t in sorted(targets.items())
        if t > positions.get(p, 0)
    ]
    if not ranges:
        return 0, 0
    rows = SqlRows(step, database.conninfo(), search_path, key, topic, targets, batch_events)

    def run() -> tuple[int, int]:
        done = read(ranges).mapInArrow(rows, RESULT_DDL).collect()
        return sum(r["events"] for r in done), sum(r["refused"] for r in done)

    return await asyncio.to_thread(run)
