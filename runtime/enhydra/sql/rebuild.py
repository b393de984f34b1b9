"""Rebuild a SQL projection into new tables while the live ones serve, then swap them in.

The rebuild folds the events topic with the projection's own `project` (fold.SqlStep) into
the same tables created in a schema of its own (`enhydra_rebuild_<name>`), one transaction per
batch with its positions (key `<name>@v<version>~rebuild`): stopped at any point, it resumes
where it stopped. The swap is one transaction:

1. lock the live tables (ACCESS EXCLUSIVE): the live writers' next batch waits for the swap;
2. fold what the live writers have folded and the rebuild has not (up to their positions);
3. drop the live tables, move the rebuilt ones into their schema, make the rebuild's positions
   the live ones, record the version.

The same version: the live writers go on in the new tables from the same positions. A new
version: the old version's positions are gone, so its writers stop (PartitionLost) rather than
write old rows into new tables; the new version starts where the rebuild ended.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from aiokafka import TopicPartition
from psycopg import AsyncConnection, sql

from enhydra.aggregate import Aggregate
from enhydra.kafka.clients import close, new_consumer, start
from enhydra.kafka.reading import partitions_of
from enhydra.logs import get_logger
from enhydra.settings import Settings
from enhydra.sql import writer
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.fold import EventRows, SqlStep
from enhydra.sql.model import SqlProjection
from enhydra.sql.writer import first_line

log = get_logger("enhydra.sql.rebuild")
BATCH_RECORDS = 2000


# filler(positions, targets) -> (events folded, events refused): fills the rebuild's tables
Filler = Callable[[dict[int, int], dict[int, int]], Awaitable[tuple[int, int]]]


class RebuildError(RuntimeError):
    """The rebuild cannot go on; the message says why and what to do."""


@dataclass(slots=True)
class Progress:
    """Where a rebuild stands: what it folded in this run, and how far it still has to go."""

    folded: int  # events folded by this run
    behind: int  # records between the rebuild's positions and where it is going
    phase: str  # "fill" (up to the topic's end) or "swap" (catching up under the lock)
    seconds: float


def shadow_schema(projection: SqlProjection) -> str:
    return f"enhydra_rebuild_{projection.name.replace('-', '_').lower()}"[:63]


def rebuild_key(projection: SqlProjection) -> str:
    return f"{projection.positions_key}~rebuild"


class Rebuild:
    """One rebuild of one projection: `await Rebuild(...).run()` fills, then swaps."""

    def __init__(
        self,
        settings: Settings,
        database: DatabaseSettings,
        projection: SqlProjection,
        events_topic: str,
        *,
        aggregate: Aggregate | None = None,
        batch_records: int = BATCH_RECORDS,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.settings = settings
        self.database = database
        self.projection = projection
        self.topic = events_topic
        self.step = SqlStep(projection, aggregate=aggregate)
        self.batch_records = batch_records
        self.on_progress = on_progress
        self.schema = shadow_schema(projection)
        self.key = rebuild_key(projection)
        self.positions: dict[int, int] = {}  # the rebuild's, as stored with its rows
        self.folded = 0
        self.refused = 0  # events whose rows the database refused (the live run dead-lettered them)
        self._started = time.monotonic()
        self._conn: AsyncConnection | None = None  # the rebuild's writes (shadow schema first)
        self._columns: dict[str, frozenset] = {}  # the new tables' columns (writer.write_plan)
        self._direct = writer.DirectCopy()
        self._consumer: Any = None

    # the whole rebuild -----------------------------------------------------------------------
    async def run(self, filler: Filler | None = None) -> dict[int, int]:
        """Fill the new tables up to the topic's end (or the live positions), then swap them in.
        Returns the positions the tables now hold.

        `filler(positions, targets)` fills them another way first (the Spark backfill), writing
        rows and positions under `self.key` into `self.schema`; what it leaves is folded here."""
        db = self.database
        try:
            lock = await AsyncConnection.connect(db.conninfo(), autocommit=True)
        except psycopg.OperationalError as exc:
            raise RebuildError(f"cannot connect to {db.describe()}: {first_line(exc)}") from None
        try:
            live_schema = await self._prepare(lock)
            self._conn = await AsyncConnection.connect(db.conninfo(), autocommit=True)
            await self._conn.execute(
                sql.SQL("SET search_path TO {}, {}").format(
                    sql.Identifier(self.schema), sql.Identifier(live_schema)
                )
            )
            self._columns = await writer.table_columns(self._conn, self.projection.tables)
            await self._open_consumer()
            partitions = await partitions_of(self._consumer, self.topic)
            if not partitions:
                raise RebuildError(f"the events topic {self.topic} does not exist")
            self.positions = await writer.load_positions(
                self._conn, self.key, self.topic, partitions
            )
            version, live = await self._live(lock)
            if version == self.projection.version:
                targets = live  # the live writers go on from these positions: never past them
            else:
                tps = [TopicPartition(self.topic, p) for p in partitions]
                ends = await self._consumer.end_offsets(tps)
                targets = {tp.partition: offset for tp, offset in ends.items()}
            if filler is not None:
                folded, refused = await filler(dict(self.positions), dict(targets))
                self.folded += folded
                self.refused += refused
                self.positions = await writer.load_positions(
                    self._conn, self.key, self.topic, partitions
                )
            await self.fill(targets, "fill")
            await self._swap(lock, live_schema)
            return dict(self.positions)
        finally:
            if self._consumer is not None:
                await close(self._consumer)
            if self._conn is not None:
                await self._conn.close()
            await lock.close()

    async def _prepare(self, conn: AsyncConnection) -> str:
        """The bookkeeping tables, and the rebuild's schema with the projection's tables (kept
        from an interrupted rebuild of the same version). Returns the live tables' schema."""
        p = self.projection
        cur = await conn.execute("SELECT current_schema()")
        live_schema = (await cur.fetchone())[0]  # type: ignore[index]
        marker = f"{p.name}~rebuild"
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('enhydra.sql.schema'))")
            await writer.ensure_bookkeeping(conn)
            cur = await conn.execute(
                f"SELECT version, ddl_digest FROM {writer.SCHEMAS} WHERE projection = %s",
                (marker,),
            )
            row = await cur.fetchone()
            # the same version, its tables made from the same DDL: what is filled is kept. A
            # marker without a digest (older code) cannot say which DDL: the fill starts over.
            if row is not None and row[0] == p.version and row[1] == p.ddl_digest:
                log.info("rebuild resumed", projection=p.name, version=p.version)
                return live_schema
            schema = sql.Identifier(self.schema)
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            await conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(schema))
            for table in p.tables:
                await conn.execute(table.create(table.name))  # type: ignore[arg-type]
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE projection LIKE %s").format(
                    sql.Identifier(live_schema, writer.POSITIONS)
                ),
                (f"{p.name}@v%~rebuild",),
            )
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (projection, version, ddl_digest) VALUES (%s, %s, %s) "
                    "ON CONFLICT (projection) DO UPDATE SET version = EXCLUDED.version, "
                    "ddl_digest = EXCLUDED.ddl_digest"
                ).format(sql.Identifier(live_schema, writer.SCHEMAS)),
                (marker, p.version, p.ddl_digest),
            )
        log.info("rebuild started", projection=p.name, version=p.version, schema=self.schema)
        return live_schema

    async def _live(self, conn: AsyncConnection, lock: bool = False) -> tuple[int | None, dict]:
        """The live tables' version (None: none yet) and their positions."""
        p = self.projection
        cur = await conn.execute(
            f"SELECT version FROM {writer.SCHEMAS} WHERE projection = %s"
            + (" FOR UPDATE" if lock else ""),
            (p.name,),
        )
        row = await cur.fetchone()
        if row is None:
            return None, {}
        cur = await conn.execute(
            f"SELECT partition, next_offset FROM {writer.POSITIONS} "
            "WHERE projection = %s AND topic = %s" + (" FOR UPDATE" if lock else ""),
            (f"{p.name}@v{row[0]}", self.topic),
        )
        return row[0], dict(await cur.fetchall())

    async def _open_consumer(self) -> None:
        s = self.settings
        consumer = new_consumer(
            s.connection,
            client_id=f"{s.instance_id}-rebuild-{self.projection.name}",
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        await start(consumer, s.connection, doing=f"read {self.topic}")
        self._consumer = consumer

    # filling ---------------------------------------------------------------------------------
    async def fill(self, targets: Mapping[int, int], phase: str) -> None:
        """Fold each partition's events from the rebuild's position up to its target."""
        consumer, conn = self._consumer, self._conn
        assert consumer is not None and conn is not None
        todo = {p: t for p, t in targets.items() if t > self.positions.get(p, 0)}
        if not todo:
            return
        tps = {p: TopicPartition(self.topic, p) for p in todo}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, self.positions.get(p, 0))
        while todo:
            batch = await consumer.getmany(timeout_ms=500, max_records=self.batch_records)
            events: list[EventRows] = []
            for tp, records in batch.items():
                p = tp.partition
                start_at = self.positions.get(p, 0)
                records = [r for r in records if start_at <= r.offset < todo.get(p, -1)]
                if records:
                    events += self.step(None, records, {}).rows  # type: ignore[arg-type]
            # Each partition moves to where the consumer stands (up to its target): past the
            # records folded and past a transaction's marker after them, as the live writers'
            # positions are. Stopping short of a marker would move the live positions back.
            moves: dict[int, tuple[int, int]] = {}
            for p in todo:
                start_at = self.positions.get(p, 0)
                read_to = min(await consumer.position(tps[p]), todo[p])
                if read_to > start_at:
                    moves[p] = (start_at, read_to)
            if moves:
                await self._write(conn, moves, events)
                for p, (_, new) in moves.items():
                    self.positions[p] = new
                self.folded += len(events)
            for p in list(todo):
                if self.positions.get(p, 0) >= todo[p]:
                    del todo[p]
                    consumer.pause(tps[p])
            self._report(todo, phase)

    async def _write(
        self, conn: AsyncConnection, moves: dict[int, tuple[int, int]], events: list[EventRows]
    ) -> None:
        self.refused += await writer.write_batch(
            conn,
            self.projection,
            self.key,
            self.topic,
            moves,
            events,
            self._refused,
            stored=self._columns,
            direct=self._direct,
        )

    def _refused(self, event: EventRows, error: BaseException) -> None:
        log.warning(
            "rebuild: an event's rows were refused; skipped",
            projection=self.projection.name,
            offset=event.record.offset,
            error=first_line(error),
        )

    def _report(self, todo: Mapping[int, int], phase: str) -> None:
        if self.on_progress is None:
            return
        behind = sum(max(0, t - self.positions.get(p, 0)) for p, t in todo.items())
        elapsed = time.monotonic() - self._started
        self.on_progress(Progress(self.folded, behind, phase, elapsed))

    # the swap --------------------------------------------------------------------------------
    async def _swap(self, conn: AsyncConnection, live_schema: str) -> None:
        p = self.projection
        live = sql.Identifier(live_schema)
        shadow = sql.Identifier(self.schema)
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_name = ANY(%s)",
                (live_schema, [t.name for t in p.tables]),
            )
            existing = [r[0] for r in await cur.fetchall()]
            if existing:
                names = sql.SQL(", ").join(sql.Identifier(live_schema, n) for n in existing)
                await conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names))
            version, positions = await self._live(conn, lock=True)
            if version == p.version:
                ahead = {q: o for q, o in self.positions.items() if o > positions.get(q, 0)}
                if ahead:
                    raise RebuildError(
                        f"projection {p.name!r}: the rebuild is past the live positions "
                        f"({ahead} > {positions}); run it again to start over"
                    )
            await self.fill(positions, "swap")
            for table in p.tables:
                await conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}.{}").format(live, sql.Identifier(table.name))
                )
                await conn.execute(
                    sql.SQL("ALTER TABLE {}.{} SET SCHEMA {}").format(
                        shadow, sql.Identifier(table.name), live
                    )
                )
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(shadow))
            await conn.execute(
                f"DELETE FROM {writer.POSITIONS} WHERE projection IN (%s, %s)",
                (f"{p.name}@v{version}", p.positions_key),
            )
            await conn.execute(
                f"UPDATE {writer.POSITIONS} SET projection = %s WHERE projection = %s",
                (p.positions_key, self.key),
            )
            await conn.execute(
                f"DELETE FROM {writer.SCHEMAS} WHERE projection = %s", (f"{p.name}~rebuild",)
            )
            await conn.execute(
                f"INSERT INTO {writer.SCHEMAS} (projection, version, ddl_digest) "
                "VALUES (%s, %s, %s) ON CONFLICT (projection) DO UPDATE SET "
                "version = EXCLUDED.version, ddl_digest = EXCLUDED.ddl_digest, created_at = now()",
                (p.name, p.version, p.ddl_digest),
            )
        log.info(
            "rebuild swapped in",
            projection=p.name,
            version=p.version,
            replaced_version=version,
            folded=self.folded,
            refused=self.refused,
        )
