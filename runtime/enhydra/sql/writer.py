"""The SQL a SQL projection runs: its bookkeeping tables, its schema, a plan's statements.

Two ways to write a plan's upserts, both measured by bench/sql_projection.py:
`copy` streams the rows into a temporary stage table with COPY, `executemany` inserts them
there pipelined by psycopg; then one UPDATE and one INSERT per shape merge the stage in (the
INSERT skipped when the UPDATE found every row; one INSERT ... ON CONFLICT for a shape that
names every column and adds to none), each row found through the table's key index.
Identifiers come from the projection's declaration, checked by model.check_name, and are
quoted; values always travel as parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import psycopg
from psycopg import AsyncConnection
from psycopg.types.json import JsonbDumper

from enhydra.sql.model import SqlProjection, Table
from enhydra.sql.rows import Plan, Shape, plan

if TYPE_CHECKING:
    from enhydra.sql.fold import EventRows

# Errors of one row's data (a constraint, a value the column refuses): that event's rows are
# refused, the others are written.
ROW_ERRORS = (psycopg.errors.IntegrityError, psycopg.errors.DataError)

POSITIONS = "enhydra_sql_positions"
SCHEMAS = "enhydra_sql_schemas"
METHODS = ("copy", "executemany")
_UNKNOWN = frozenset({""})  # a table whose columns were not read: never whole

BOOKKEEPING = (
    f"CREATE TABLE IF NOT EXISTS {POSITIONS} ("
    " projection text NOT NULL, topic text NOT NULL, partition int NOT NULL,"
    " next_offset bigint NOT NULL, PRIMARY KEY (projection, topic, partition))",
    f"CREATE TABLE IF NOT EXISTS {SCHEMAS} ("
    " projection text PRIMARY KEY, version int NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now(), ddl_digest text)",
)
# SqlProjection.ddl_digest, for a database made before it was kept (NULL there: taken as it
# is). Only when the column is missing: ALTER TABLE needs the table's owner and its strongest
# lock even when there is nothing to add, and a service's role may only have been granted DML.
_DIGEST_COLUMN = (
    f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
    f"'{SCHEMAS}'::regclass AND attname = 'ddl_digest' AND NOT attisdropped) THEN "
    f"ALTER TABLE {SCHEMAS} ADD COLUMN ddl_digest text; END IF; END $$"
)


async def ensure_bookkeeping(conn: AsyncConnection) -> None:
    """The positions and schemas tables, as this version of Enhydra keeps them (in the
    caller's transaction, under its lock)."""
    for statement in (*BOOKKEEPING, _DIGEST_COLUMN):
        await conn.execute(statement)


class SchemaMismatch(RuntimeError):
    """The database holds the projection's tables at another version than the code declares."""


class PartitionLost(RuntimeError):
    """Another instance moved a partition's position since this one read it: not ours now."""


def _q(name: str) -> str:
    return f'"{name}"'


def _json_cursor(conn: AsyncConnection) -> Any:
    """A cursor that writes dicts and lists as jsonb: a row's values then go to COPY or
    executemany as they are, with no Python call per value to wrap them (the connection's own
    adapters, which write a list as an array, stay as they are)."""
    cur = conn.cursor()
    cur.adapters.register_dumper(dict, JsonbDumper)
    cur.adapters.register_dumper(list, JsonbDumper)
    return cur


async def ensure_schema(conn: AsyncConnection, projection: SqlProjection) -> bool:
    """Create the bookkeeping and the projection's tables once; True when they were created.

    Instances starting together take one advisory lock, so only one runs the DDL.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('enhydra.sql.schema'))")
        await ensure_bookkeeping(conn)
        cur = await conn.execute(
            f"SELECT version, ddl_digest FROM {SCHEMAS} WHERE projection = %s",
            (projection.name,),
        )
        row = await cur.fetchone()
        digest = projection.ddl_digest
        if row is not None:
            version, stored = row
            if version != projection.version:
                raise SchemaMismatch(
                    f"projection {projection.name!r}: the database holds its tables at schema "
                    f"version {version}, the code declares version {projection.version}; "
                    "run `enhydra projection rebuild TARGET NAME` to build and swap in this "
                    "version's tables"
                )
            if stored is None:  # made before digests were kept
                await conn.execute(
                    f"UPDATE {SCHEMAS} SET ddl_digest = %s WHERE projection = %s",
                    (digest, projection.name),
                )
            elif stored != digest:
                raise SchemaMismatch(
                    f"projection {projection.name!r}: its tables' DDL changed but its version "
                    f"did not (still {version}): the database's tables were made from the old "
                    f"DDL; declare version={version + 1} and run `enhydra projection rebuild "
                    "TARGET NAME` to build and swap in the new tables"
                )
            return False
        for table in projection.tables:
            await conn.execute(table.create(table.name))  # type: ignore[arg-type]
        await conn.execute(
            f"INSERT INTO {SCHEMAS} (projection, version, ddl_digest) VALUES (%s, %s, %s)",
            (projection.name, projection.version, digest),
        )
        return True


async def load_positions(
    conn: AsyncConnection, projection: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """The next events offset to fold per partition, as committed with the rows (a partition
    seen for the first time starts at 0)."""
    wanted = sorted(partitions)
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.executemany(
                f"INSERT INTO {POSITIONS} (projection, topic, partition, next_offset) "
                "VALUES (%s, %s, %s, 0) ON CONFLICT DO NOTHING",
                [(projection, topic, p) for p in wanted],
            )
        return await stored_positions(conn, projection, topic, wanted)


async def stored_positions(
    conn: AsyncConnection, projection: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """The positions stored for these partitions, as they are: a partition without one (never
    written, or a rebuild's swap removed this version's) is left out, not created."""
    cur = await conn.execute(
        f"SELECT partition, next_offset FROM {POSITIONS} "
        "WHERE projection = %s AND topic = %s AND partition = ANY(%s)",
        (projection, topic, sorted(partitions)),
    )
    return {p: o for p, o in await cur.fetchall()}


async def move_positions(
    conn: AsyncConnection,
    projection: str,
    topic: str,
    moves: Mapping[int, tuple[int, int]],
) -> None:
    """Move each partition's position from `expected` to `new` (partition -> (expected, new)),
    or raise PartitionLost: a position another writer moved means the partition is not ours.
    One statement for all partitions: one round trip per batch."""
    ordered = sorted(moves.items())
    cur = await conn.execute(
        f"UPDATE {POSITIONS} p SET next_offset = m.new FROM unnest(%s::int[], %s::bigint[], "
        "%s::bigint[]) AS m(partition, expected, new) WHERE p.projection = %s AND p.topic = %s "
        "AND p.partition = m.partition AND p.next_offset = m.expected RETURNING p.partition",
        (
            [p for p, _ in ordered],
            [e for _, (e, _) in ordered],
            [n for _, (_, n) in ordered],
            projection,
            topic,
        ),
    )
    moved = {row[0] for row in await cur.fetchall()}
    for partition, (expected, _) in ordered:
        if partition not in moved:
            raise PartitionLost(
                f"projection {projection!r}: partition {partition} of {topic} was moved past "
                f"offset {expected} by another instance; this one no longer owns it"
            )


def _set(table: Table, columns: tuple[str, ...], add: tuple[str, ...], source: str) -> list[str]:
    return [
        f"{_q(c)} = {_q(table.name)}.{_q(c)} + {source}.{_q(c)}"
        if c in add
        else f"{_q(c)} = {source}.{_q(c)}"
        for c in columns
        if c not in table.key
    ]


def merge_sql(
    table: Table, columns: tuple[str, ...], add: tuple[str, ...], stage: str, whole: bool = False
) -> tuple[str | None, str]:
    """The statements that merge a stage's rows into `table`: an UPDATE of the rows that exist
    (None when there is nothing to update), then an INSERT of the others. An INSERT ... ON
    CONFLICT alone would not do: PostgreSQL checks NOT NULL and CHECK constraints on the row to
    insert before it finds the conflict, so a row naming only some columns could never update a
    stored one. The stage holds each key once (rows.plan), so an UPDATE that changed as many
    rows as the stage holds leaves nothing to insert.

    `whole`: the rows name every column of the table and add to none, so the row to insert is
    the row to store and its checks are the stored row's: one INSERT ... ON CONFLICT does it.
    """
    t = _q(table.name)
    names = ", ".join(map(_q, columns))
    conflict = ", ".join(map(_q, table.key))
    # Another instance may insert the key meanwhile (a projection writing one row from several
    # partitions): then the insert updates it instead.
    again = _set(table, columns, add, "EXCLUDED")
    action = f"DO UPDATE SET {', '.join(again)}" if again else "DO NOTHING"
    if whole and not add:
        upsert = f"INSERT INTO {t} ({names}) SELECT {names} FROM {stage}"
        return None, f"{upsert} ON CONFLICT ({conflict}) {action}"
    same_key = " AND ".join(f"{t}.{_q(c)} = s.{_q(c)}" for c in table.key)
    updates = _set(table, columns, add, "s")
    update = f"UPDATE {t} SET {', '.join(updates)} FROM {stage} s WHERE {same_key}"
    insert = (
        f"INSERT INTO {t} ({names}) SELECT {names} FROM {stage} s "
        f"WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE {same_key}) "
        f"ON CONFLICT ({conflict}) {action}"
    )
    return (update if updates else None), insert


# A stage holds one batch, each key once: its rows are best found through the table's key
# index, one lookup each. Without statistics on the temporary stage, the planner hashes the
# whole table instead while the table is small (it did at 50,000 rows, no longer at
# 1,000,000), a cost per batch that grows with the table: 1.4x the merge time at 50,000 rows.
# For the batch's transaction only (the unique index ON CONFLICT needs is always there).
_INDEX_LOOKUPS = (
    "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
)


async def table_columns(conn: AsyncConnection, tables: Iterable[Table]) -> dict[str, frozenset]:
    """Each table's columns as the database has them now (for merge_sql's `whole`), read once
    at start. A column added later (with a DEFAULT, as a filled table needs) changes nothing:
    the insert takes the default, the update leaves the column alone. A row the one-statement
    upsert refuses is written again event by event, without it (commit.py)."""
    cur = await conn.execute(
        "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "WHERE c.oid = ANY(%s::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped",
        ([_q(t.name) for t in tables],),
    )
    columns: dict[str, set[str]] = {}
    for table, column in await cur.fetchall():
        columns.setdefault(table, set()).add(column)
    return {name: frozenset(found) for name, found in columns.items()}


def _stage_name(shape: Shape) -> str:
    """One stage per shape, added columns included: two shapes of the same columns (a value set
    for one key, added for another) in one batch must not merge each other's rows."""
    digest = hashlib.blake2s(repr(shape).encode(), digest_size=6).hexdigest()
    return f"_enhydra_stage_{digest}"


def _create_stage(shape: Shape) -> str:
    table, columns, _ = shape
    names = ", ".join(map(_q, columns))
    return (
        f"CREATE TEMP TABLE IF NOT EXISTS {_stage_name(shape)} ON COMMIT DELETE ROWS "
        f"AS SELECT {names} FROM {_q(table)} WITH NO DATA"
    )


# The stage tables each pooled connection has (a temporary table lives as long as its session).
_stages: WeakKeyDictionary[AsyncConnection, set[str]] = WeakKeyDictionary()


async def prepare_stages(conn: AsyncConnection, plan: Plan) -> None:
    """Create the plan's stage tables a connection lacks, outside the batch's transaction (on
    an autocommit connection): a batch then needs one statement less per shape."""
    known = _stages.setdefault(conn, set())
    for shape in plan.upserts:
        stage = _stage_name(shape)
        if stage not in known:
            await conn.execute(_create_stage(shape))
            known.add(stage)


class DirectCopy:
    """Which shapes' rows are first copied straight into their table.

    Whole rows (every column, nothing added) of keys the table does not hold yet need no
    merge: COPY puts them in at the speed of the database's own COPY into a keyed table, about
    three times the stage and merge. A batch holding a stored key is refused by the key's
    index, undone (a savepoint) and merged as usual; that shape then waits 2, 4, ... 64
    batches before it is tried again, so a projection that rewrites its rows pays little.
    A table PostgreSQL will not COPY into (row-level security) is merged from then on. COPY
    runs the table's triggers but not its rules (CREATE RULE): a table with rules should not
    be written through a projection's whole rows. One per writer (a commit unit, a rebuild, a
    backfill task).
    """

    LONGEST_WAIT = 64

    def __init__(self) -> None:
        self._wait: dict[Shape, int] = {}  # batches to skip before the next try
        self._after_refusal: dict[Shape, int] = {}  # the wait a refusal sets
        self._never: set[str] = set()  # tables COPY is not allowed into

    def worth_trying(self, shape: Shape) -> bool:
        if shape[0] in self._never:
            return False
        left = self._wait.get(shape, 0)
        if left:
            self._wait[shape] = left - 1
        return not left

    def landed(self, shape: Shape) -> None:
        self._after_refusal.pop(shape, None)

    def refused(self, shape: Shape) -> None:
        wait = min(self._after_refusal.get(shape, 1) * 2, self.LONGEST_WAIT)
        self._after_refusal[shape] = self._wait[shape] = wait

    def not_allowed(self, table: str) -> None:
        self._never.add(table)


async def _copy_new_rows(
    conn: AsyncConnection, cur: Any, table: str, shape: Shape, rows, direct: DirectCopy
) -> bool:
    """COPY whole rows straight into `table`, undone when one of their keys is stored (or a
    row is refused: the merge then says which); True when they landed."""
    names = ", ".join(map(_q, shape[1]))
    try:
        # a savepoint: a refusal undoes this COPY only
        async with conn.transaction(), cur.copy(f"COPY {_q(table)} ({names}) FROM STDIN") as copy:
            for row in rows:
                await copy.write_row(row)
    except ROW_ERRORS:
        direct.refused(shape)
        return False
    except psycopg.errors.FeatureNotSupported:  # "COPY FROM not supported with row-level security"
        direct.not_allowed(table)
        return False
    direct.landed(shape)
    return True


async def write_plan(
    conn: AsyncConnection,
    plan: Plan,
    tables: Mapping[str, Table],
    method: str = "copy",
    *,
    clear: bool = False,
    prepared: bool = False,
    stored: Mapping[str, frozenset] | None = None,
    direct: DirectCopy | None = None,
) -> None:
    """Run the plan's deletes, then its upserts, inside the caller's transaction.

    Upserts go through a temporary stage table per shape (emptied at commit, or at once with
    `clear` when the transaction writes several plans), filled by COPY or by a pipelined
    executemany, then merged (merge_sql). `prepared`: prepare_stages created them already.
    `stored` (table_columns): a shape naming all of its table's columns merges in one statement,
    and with `direct` and the `copy` method, is first copied straight into the table.
    """
    async with _json_cursor(conn) as cur:
        lookups_set = False
        for name, keys in plan.deletes.items():
            table = tables[name]
            where = " AND ".join(f"{_q(c)} = %s" for c in table.key)
            await cur.executemany(f"DELETE FROM {_q(name)} WHERE {where}", keys)
        for shape, values in plan.upserts.items():
            name, columns, add = shape
            table = tables[name]
            whole = stored is not None and stored.get(name, _UNKNOWN) <= set(columns)
            straight = whole and not add and method == "copy" and direct is not None
            straight = straight and direct.worth_trying(shape)  # type: ignore[union-attr]
            if straight and await _copy_new_rows(conn, cur, name, shape, values, direct):  # type: ignore[arg-type]
                continue
            stage = _stage_name(shape)
            names = ", ".join(map(_q, columns))
            if not prepared:
                await cur.execute(_create_stage(shape))
            if method == "executemany":
                marks = ", ".join(["%s"] * len(columns))
                await cur.executemany(f"INSERT INTO {stage} ({names}) VALUES ({marks})", values)
            else:
                async with cur.copy(f"COPY {stage} ({names}) FROM STDIN") as copy:
                    for row in values:
                        await copy.write_row(row)
            if not lookups_set:  # once per transaction, and only when something is merged
                await cur.execute(_INDEX_LOOKUPS)
                lookups_set = True
            update, insert = merge_sql(table, columns, add, stage, whole)
            if update is not None:
                await cur.execute(update)
            if update is None or cur.rowcount < len(values):
                await cur.execute(insert)
            if clear:
                await cur.execute(f"DELETE FROM {stage}")


async def write_batch(
    conn: AsyncConnection,
    projection: SqlProjection,
    key: str,
    topic: str,
    moves: Mapping[int, tuple[int, int]],
    events: list[EventRows],
    on_refused: Callable[[EventRows, BaseException], None] | None = None,
    *,
    stored: Mapping[str, frozenset] | None = None,
    direct: DirectCopy | None = None,
) -> int:
    """One batch's rows and positions (under `key`) in one transaction; returns how many events
    the database refused. A refused event is skipped (the live run dead-lettered it), so the
    rebuild and the backfill (spark/sql_sink.py) leave the rows the live run leaves.
    `stored` and `direct`: as for write_plan (a rebuild fills empty tables: mostly new keys).

    Imports psycopg and the pure sql modules only: the backfill's executors run it.
    """
    tables = projection.by_name
    the_plan = plan([op for e in events for op in e.ops], tables)
    await prepare_stages(conn, the_plan)
    try:
        async with conn.transaction():
            await write_plan(conn, the_plan, tables, prepared=True, stored=stored, direct=direct)
            await move_positions(conn, key, topic, dict(moves))
        return 0
    except ROW_ERRORS:
        pass
    refused = 0
    async with conn.transaction():
        for event in events:
            try:
                async with conn.transaction():  # a savepoint
                    await write_plan(conn, plan(event.ops, tables), tables, clear=True)
            except ROW_ERRORS as exc:
                refused += 1
                if on_refused is not None:
                    on_refused(event, exc)
        await move_positions(conn, key, topic, dict(moves))
    return refused


def first_line(error: BaseException) -> str:
    """An error's first line, at most 300 characters: what a log line or a reason shows."""
    return (str(error).splitlines() or [""])[0][:300]
