"""The database side of a SQL projection against a real PostgreSQL (no Kafka): schema versions,
positions that fence another writer, and the merge of partial rows."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from enhydra.sql import SqlProjection, Upsert
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.rows import plan
from enhydra.sql.writer import (
    PartitionLost,
    SchemaMismatch,
    ensure_schema,
    load_positions,
    move_positions,
    prepare_stages,
    write_plan,
)
from tests.sql.accounts import ACCOUNTS, PROJECTION

pytestmark = pytest.mark.integration  # a real PostgreSQL server


async def connect(db: DatabaseSettings):
    import psycopg

    return await psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True)


async def test_the_schema_is_created_once_and_another_version_is_refused(
    database: DatabaseSettings,
) -> None:
    async with await connect(database) as conn:
        assert await ensure_schema(conn, PROJECTION) is True
        assert await ensure_schema(conn, PROJECTION) is False
        newer = SqlProjection(PROJECTION.name, PROJECTION.project, (ACCOUNTS,), version=2)
        with pytest.raises(SchemaMismatch, match="schema version 1, the code declares version 2"):
            await ensure_schema(conn, newer)


async def test_a_position_moved_by_another_writer_fences_this_one(
    database: DatabaseSettings,
) -> None:
    async with await connect(database) as conn:
        await ensure_schema(conn, PROJECTION)
        assert await load_positions(conn, "accounts", "events", [0, 1]) == {0: 0, 1: 0}
        async with conn.transaction():
            await move_positions(conn, "accounts", "events", {0: (0, 10)})
        with pytest.raises(PartitionLost, match="partition 0 of events was moved past offset 0"):
            async with conn.transaction():
                await move_positions(conn, "accounts", "events", {0: (0, 5)})
        assert (await load_positions(conn, "accounts", "events", [0]))[0] == 10


@pytest.mark.parametrize("method", ["copy", "executemany"])
async def test_a_partial_row_updates_a_stored_one_under_not_null_and_check(
    database: DatabaseSettings, method: str
) -> None:
    """An INSERT ... ON CONFLICT of the partial row alone fails on `owner NOT NULL`."""
    tables = PROJECTION.by_name
    async with await connect(database) as conn:
        await ensure_schema(conn, PROJECTION)
        for ops in (
            [Upsert("accounts", {"id": "a", "owner": "ann", "balance": 0, "events": 1})],
            [Upsert("accounts", {"id": "a", "balance": 7, "events": 1}, add=("balance", "events"))],
            [Upsert("accounts", {"id": "a", "balance": 3, "events": 1}, add=("balance", "events"))],
        ):
            the_plan = plan(ops, tables)
            await prepare_stages(conn, the_plan)
            async with conn.transaction():
                await write_plan(conn, the_plan, tables, method, prepared=True)
        cur = await conn.execute("SELECT id, owner, balance, events FROM accounts")
        assert await cur.fetchall() == [("a", "ann", 10, 3)]
