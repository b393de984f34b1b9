"""The commit unit of a SQL projection: a batch's rows and the positions they cover, together.

One PostgreSQL transaction per batch writes the rows (rows.plan -> writer.write_plan) and
moves each events partition's position from the offset this instance last read or wrote to
the one after the batch. So the tables are exactly-once with respect to the events topic
whatever crashes: a transaction that did not commit left nothing, and on assignment the
input resumes at the stored position (`open_task` returns it; Kafka's committed offsets are
not used). A position another writer moved forward means two instances folded the partition
around a rebalance (a previous owner's last batch landing late, or this one being that previous
owner): what they folded is in the tables, so the batch is dropped and read again from the
stored position (PositionMoved), and the group's next heartbeat says who owns it. A position
gone or moved back (a rebuild's swap to a new version, a reset) stops the task (PartitionLost).

A row the database refuses (a constraint, a value out of range) fails the whole batch; the
batch is then written again one event at a time, each under a savepoint: an event whose rows
are refused goes to the DLQ with the SQL error (acknowledged before the transaction commits,
so a crash can copy a dead letter, never lose one) and the projection goes on.

The database down (no connection, a connection lost, a deadlock) is waited out: the batch is
tried again with a backoff, `waiting` says why, and the runner stays on the batch (its input
pauses). A commit whose outcome is unknown is settled by reading the positions before the
next attempt: moved to the batch's end, it committed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from enhydra.errors.dlq import dead_letter_headers, error_class, within
from enhydra.errors.failure import Failure, Stage
from enhydra.kafka.clients import Producer, close, new_producer, start
from enhydra.logs import get_logger
from enhydra.runner.batch import PartitionWrite
from enhydra.runner.checkpoint import (
    Flight,
    Guard,
    StaleBatch,
    Written,
    begin_flight,
    record_limit,
    settle_future,
)
from enhydra.settings import Settings
from enhydra.sql import writer
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.fold import EventRows
from enhydra.sql.model import SqlProjection
from enhydra.sql.rows import plan
from enhydra.sql.writer import ROW_ERRORS, first_line
from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.sql")

# Errors of one row's data (writer.ROW_ERRORS): the event goes to the DLQ. Others that are not
# "unavailable" stop. Unavailable: the database is unreachable or rolled us back (deadlock,
# serialization): try again.
UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError)
BACKOFF_S = (0.2, 5.0)  # first and largest wait between two attempts


class SqlCommit:
    """Checkpoint (runner/checkpoint.py) for a SQL projection; one pool, one DLQ producer."""

    def __init__(
        self,
        settings: Settings,
        database: DatabaseSettings,
        projection: SqlProjection,
        *,
        input_topic: str,
        client_id: str,
        method: str = "copy",
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        if method not in writer.METHODS:
            raise ValueError(f"write method {method!r}: use one of {', '.join(writer.METHODS)}")
        self.settings = settings
        self.database = database
        self.projection = projection
        self.tables = projection.by_name
        self.input_topic = input_topic
        self.client_id = client_id
        self.method = method
        self.backoff_s = backoff_s
        self.max_record_bytes = 1_000_000
        self.next: dict[int, int] = {}  # partition -> next offset, as stored with the rows
        self.waiting: str | None = None  # why the projection waits now (None: it does not)
        self.stats = {"rows": 0, "transactions": 0, "dead_lettered": 0, "db_retries": 0}
        self.columns: dict[str, frozenset] = {}  # the tables' columns, read at start
        self.direct = writer.DirectCopy()
        self._pool: AsyncConnectionPool | None = None
        self._producer: Producer | None = None

    # lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        db = self.database
        self._pool = AsyncConnectionPool(
            db.conninfo,  # called per connection: a rotated password file is read again
            min_size=db.pool_min,
            max_size=db.pool_max,
            # autocommit: transactions are explicit (conn.transaction()), and the stage tables
            # are created outside them (writer.prepare_stages)
            kwargs={"connect_timeout": max(1, round(db.connect_timeout_s)), "autocommit": True},
            open=False,
            name=f"enhydra-{self.projection.name}",
        )
        await self._pool.open(wait=False)
        created = await self._db("create the schema", self._ensure_schema)
        s = self.settings
        self.max_record_bytes = await record_limit(s, [s.dlq_topic], self.client_id)
        producer = new_producer(
            s.connection, client_id=f"{self.client_id}-dlq", acks="all", enable_idempotence=True
        )
        await start(producer, s.connection, doing="start the dead-letter producer")
        self._producer = producer
        log.info(
            "sql projection connected",
            projection=self.projection.name,
            database=db.describe(),
            version=self.projection.version,
            created=created,
            method=self.method,
        )

    async def _ensure_schema(self, conn: AsyncConnection) -> bool:
        created = await writer.ensure_schema(conn, self.projection)
        self.columns = await writer.table_columns(conn, self.projection.tables)
        return created

    async def stop(self) -> None:
        if self._producer is not None:
            await close(self._producer)
            self._producer = None
        if self._pool is not None:
            await self._pool.close(timeout=5.0)
            self._pool = None

    async def open_task(self, partition: int) -> int:
        """Where the partition's input resumes: the position stored with the rows."""

        async def load(conn: AsyncConnection) -> dict[int, int]:
            return await writer.load_positions(
                conn, self.projection.positions_key, self.input_topic, [partition]
            )

        position = (await self._db("read the stored position", load))[partition]
        self.next[partition] = position
        return position

    async def close_task(self, partition: int) -> None:
        self.next.pop(partition, None)

    async def commit(self, force: bool = False) -> None:
        """Positions were committed with the rows."""

    # the database, waited for ----------------------------------------------------------------
    async def _db(self, what: str, call: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
        """Run `call` on a pooled connection, waiting out an unavailable database."""
        assert self._pool is not None
        backoff, largest = self.backoff_s
        since: float | None = None
        while True:
            try:
                async with self._pool.connection(timeout=self.database.connect_timeout_s) as conn:
                    result = await call(conn)
            except UNAVAILABLE as exc:
                self.stats["db_retries"] += 1
                reason = f"database unavailable: {error_class(exc)}: {first_line(exc)}"
                if since is None:
                    since = time.monotonic()
                    log.warning(
                        f"could not {what}; waiting for the database",
                        projection=self.projection.name,
                        database=self.database.describe(),
                        error=reason,
                    )
                self.waiting = reason
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, largest)
                continue
            if since is not None:
                log.info(
                    "database available again",
                    projection=self.projection.name,
                    waited_s=round(time.monotonic() - since, 1),
                )
                self.waiting = None
            return result

    # a batch ---------------------------------------------------------------------------------
    def begin(
        self,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard | None = None,
    ) -> Flight:
        """`guard` is not needed: a stale owner's transaction fails on the positions."""
        return begin_flight(lambda flight: self._fly(flight, batch, stores, after))

    async def _fly(
        self,
        flight: Flight,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
    ) -> list[Written]:
        try:
            if after is not None:
                await after.done
            flight.sent_at = time.time()
            moves: dict[int, tuple[int, int]] = {}
            events: list[tuple[int, EventRows]] = []
            for write in batch:
                if write.last_offset < 0:
                    continue
                expected = self.next[write.partition]
                new = max(expected, write.last_offset + 1)
                moves[write.partition] = (expected, new)
                events += [
                    (write.partition, e) for e in write.rows or () if e.record.offset >= expected
                ]
            if moves:
                attempt = _Attempt(self, moves, events)
                try:
                    await self._db("write a batch", attempt)
                except writer.PartitionLost:
                    await self._moved_on(moves)
                    raise
                for partition, (_, new) in moves.items():
                    self.next[partition] = new
            flight.published_at = flight.done_at = time.time()
            settle_future(flight.published)
        except BaseException as exc:
            settle_future(flight.published, exc)
            raise
        written = []
        for write in batch:
            if write.partition in moves:
                # The store only mirrors the position, for the runner's lags and watchdog.
                stores[write.partition].write([], input_offset=write.last_offset)
            written.append(Written(write.partition, None, write.last_offset))
        return written

    async def _moved_on(self, moves: Mapping[int, tuple[int, int]]) -> None:
        """After PartitionLost: raise PositionMoved when every position of the batch is where
        it started or further on (another writer folded ahead), moving this unit's next offsets
        there; return (the loss stands) when one is gone or moved back."""
        key, topic = self.projection.positions_key, self.input_topic

        async def load(conn: AsyncConnection) -> dict[int, int]:
            return await writer.stored_positions(conn, key, topic, moves)

        stored = await self._db("read the stored positions", load)
        if any(stored.get(p, -1) < start for p, (start, _) in moves.items()):
            return
        self.next.update(stored)
        ahead = {p: o for p, o in stored.items() if o > moves[p][0]}
        log.warning(
            "another writer folded ahead of this batch; reading it again from there",
            projection=self.projection.name,
            positions=ahead,
        )
        raise PositionMoved(f"positions {ahead} were moved by another writer") from None

    async def dead_letter(self, partition: int, failures: list[tuple[Any, BaseException]]) -> None:
        """Publish refused events to the DLQ and wait for the acknowledgements."""
        assert self._producer is not None
        s = self.settings
        futures = []
        for record, error in failures:
            headers = dead_letter_headers(
                Failure(record, Stage.PROCESS, error),
                topic=self.input_topic,
                partition=partition,
                app_id=s.app_id,
                instance_id=s.instance_id,
            )
            key, value, headers = within(record.key, record.value, headers, self.max_record_bytes)
            futures.append(await self._producer.send(s.dlq_topic, value, key=key, headers=headers))
        await asyncio.gather(*futures)


class PositionMoved(StaleBatch):
    """Another writer folded the partition past this batch's start: the batch is read again
    from the stored position (the runner drops it, as after a stall), folding only the rest."""

    ask_the_group = True


class _Attempt:
    """One try at a batch's transaction; a retry first learns whether the last one committed."""

    def __init__(
        self,
        unit: SqlCommit,
        moves: dict[int, tuple[int, int]],
        events: list[tuple[int, EventRows]],
    ) -> None:
        self.unit = unit
        self.moves = moves
        self.events = events
        self.tried = False

    async def __call__(self, conn: AsyncConnection) -> None:
        unit = self.unit
        name, topic = unit.projection.name, unit.input_topic
        if self.tried and await self._committed(conn):
            return
        self.tried = True
        the_plan = plan([op for _, e in self.events for op in e.ops], unit.tables)
        await writer.prepare_stages(conn, the_plan)
        try:
            async with conn.transaction():
                await writer.write_plan(
                    conn,
                    the_plan,
                    unit.tables,
                    unit.method,
                    prepared=True,
                    stored=unit.columns,
                    direct=unit.direct,
                )
                await writer.move_positions(conn, unit.projection.positions_key, topic, self.moves)
            unit.stats["rows"] += the_plan.rows
            unit.stats["transactions"] += 1
            return
        except ROW_ERRORS as exc:
            log.warning(
                "a row was refused; writing the batch one event at a time",
                projection=name,
                error=f"{error_class(exc)}: {first_line(exc)}",
            )
        await self._one_by_one(conn)

    async def _committed(self, conn: AsyncConnection) -> bool:
        """After a failed attempt: True when it committed after all (its positions moved)."""
        unit = self.unit
        stored = await writer.stored_positions(
            conn, unit.projection.positions_key, unit.input_topic, self.moves
        )
        if all(stored.get(p) == new for p, (_, new) in self.moves.items()):
            return True
        if all(stored.get(p) == old for p, (old, _) in self.moves.items()):
            return False
        raise writer.PartitionLost(
            f"projection {unit.projection.name!r}: positions {stored} match neither the batch's "
            f"start nor its end ({self.moves}): another instance writes these partitions"
        )

    async def _one_by_one(self, conn: AsyncConnection) -> None:
        unit = self.unit
        failed: dict[int, list[tuple[Any, BaseException]]] = {}
        rows = 0
        async with conn.transaction():
            for partition, event in self.events:
                if not event.ops:
                    continue
                try:
                    async with conn.transaction():  # a savepoint
                        the_plan = plan(event.ops, unit.tables)
                        await writer.write_plan(conn, the_plan, unit.tables, clear=True)
                    rows += the_plan.rows
                except ROW_ERRORS as exc:
                    failed.setdefault(partition, []).append((event.record, exc))
            key = unit.projection.positions_key
            await writer.move_positions(conn, key, unit.input_topic, self.moves)
            for partition, failures in failed.items():
                for record, exc in failures:
                    log.error(
                        "event dead-lettered: the database refused its rows",
                        projection=unit.projection.name,
                        partition=partition,
                        offset=record.offset,
                        error=f"{error_class(exc)}: {first_line(exc)}",
                    )
                await unit.dead_letter(partition, failures)
        unit.stats["rows"] += rows
        unit.stats["transactions"] += 1
        unit.stats["dead_lettered"] += sum(map(len, failed.values()))
