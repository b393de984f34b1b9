"""The database side of a SQL projection against a real PostgreSQL (no Kafka): schema versions,
positions that fence another writer, and the merge of partial rows."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from enhydra.sql import Delete, SqlProjection, Table, Upsert, writer
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.rows import plan
from enhydra.sql.writer import (
    DirectCopy,
    PartitionLost,
    SchemaMismatch,
    ensure_schema,
    load_positions,
    move_positions,
    prepare_stages,
    table_columns,
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


async def test_ddl_changed_without_a_new_version_is_refused_whitespace_aside(
    database: DatabaseSettings,
) -> None:
    """Tables made from the old DDL would refuse the new rows one by one (every event to the
    DLQ): the start is refused instead, naming the version to declare. A database made before
    digests were kept takes the code's as it is."""
    async with await connect(database) as conn:
        assert await ensure_schema(conn, PROJECTION) is True
        spaced = Table(ACCOUNTS.name, ACCOUNTS.key, "  " + ACCOUNTS.ddl.replace(" ", "\n  "))
        same = SqlProjection(PROJECTION.name, PROJECTION.project, (spaced,))
        assert await ensure_schema(conn, same) is False
        wider = ACCOUNTS.ddl.replace("events", "note text NOT NULL DEFAULT '', events")
        changed = SqlProjection(
            PROJECTION.name, PROJECTION.project, (Table(ACCOUNTS.name, ACCOUNTS.key, wider),)
        )
        with pytest.raises(
            SchemaMismatch, match=r"DDL changed but its version did not .* version=2"
        ):
            await ensure_schema(conn, changed)
        await conn.execute("UPDATE enhydra_sql_schemas SET ddl_digest = NULL")
        assert await ensure_schema(conn, changed) is False  # adopted
        with pytest.raises(SchemaMismatch, match="DDL changed"):
            await ensure_schema(conn, PROJECTION)


async def test_a_role_granted_rows_only_starts_and_an_older_schemas_table_gets_its_digest(
    database: DatabaseSettings,
) -> None:
    """A service's role that may write the rows but does not own the bookkeeping tables (made
    by another role) starts: nothing it is not allowed to do runs once the tables are there.
    A schemas table from before the DDL digest gets the column."""
    import uuid

    role = f"dml_{uuid.uuid4().hex[:8]}"
    async with await connect(database) as conn:
        assert await ensure_schema(conn, PROJECTION) is True
        await conn.execute("ALTER TABLE enhydra_sql_schemas DROP COLUMN ddl_digest")
        assert await ensure_schema(conn, PROJECTION) is False  # the column is back
        cur = await conn.execute("SELECT ddl_digest FROM enhydra_sql_schemas")
        assert await cur.fetchall() == [(PROJECTION.ddl_digest,)]
        await conn.execute(f"CREATE ROLE {role} NOLOGIN")
        try:
            await conn.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {role}")
            await conn.execute(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON enhydra_sql_positions, "
                f"enhydra_sql_schemas, accounts TO {role}"
            )
            await conn.execute(f"SET ROLE {role}")
            assert await ensure_schema(conn, PROJECTION) is False
            await conn.execute("RESET ROLE")
        finally:
            await conn.execute("RESET ROLE")
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")


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


DOCS = SqlProjection(
    "docs",
    lambda k, e: [],
    (Table("docs", ("id",), "CREATE TABLE {table} (id text PRIMARY KEY, doc jsonb, tags jsonb)"),),
)


@pytest.mark.parametrize("method", ["copy", "executemany"])
async def test_dicts_and_lists_land_as_jsonb_and_positions_move_together(
    database: DatabaseSettings, method: str
) -> None:
    """Values go to COPY/executemany as they are: the writer's cursor adapts dicts and lists."""
    tables = DOCS.by_name
    async with await connect(database) as conn:
        await ensure_schema(conn, DOCS)
        await load_positions(conn, "docs", "events", [0, 1])
        ops = [
            Upsert("docs", {"id": "a", "doc": {"n": [1, {"x": None}]}, "tags": ["t", 2]}),
            Upsert("docs", {"id": "b", "doc": {}, "tags": []}),
            Upsert("docs", {"id": "c", "doc": None, "tags": None}),
            Delete("docs", {"id": "b"}),
        ]
        the_plan = plan(ops, tables)
        await prepare_stages(conn, the_plan)
        async with conn.transaction():
            await write_plan(conn, the_plan, tables, method, prepared=True)
            await move_positions(conn, "docs", "events", {0: (0, 5), 1: (0, 2)})
        cur = await conn.execute("SELECT id, doc, tags FROM docs ORDER BY id")
        assert await cur.fetchall() == [
            ("a", {"n": [1, {"x": None}]}, ["t", 2]),
            ("c", None, None),
        ]
        assert await load_positions(conn, "docs", "events", [0, 1]) == {0: 5, 1: 2}


@pytest.mark.parametrize("method", ["copy", "executemany"])
async def test_whole_rows_merge_in_one_upsert_and_partial_ones_still_merge(
    database: DatabaseSettings, method: str
) -> None:
    """A shape naming every column and adding to none is one INSERT ... ON CONFLICT; a shape
    that adds keeps the two-statement merge; a column added after the columns were read takes
    its default."""
    tables = PROJECTION.by_name
    async with await connect(database) as conn:
        await ensure_schema(conn, PROJECTION)
        stored = await table_columns(conn, PROJECTION.tables)
        assert stored == {"accounts": frozenset({"id", "owner", "balance", "events"})}
        whole = {"id": "a", "owner": "ann", "balance": 5, "events": 1}
        for ops in (
            [Upsert("accounts", whole)],
            [
                Upsert("accounts", {**whole, "owner": "bob"}),
                Upsert("accounts", {**whole, "id": "b"}),
            ],
            [Upsert("accounts", {"id": "a", "balance": 2, "events": 1}, add=("balance", "events"))],
        ):
            the_plan = plan(ops, tables)
            await prepare_stages(conn, the_plan)
            async with conn.transaction():
                await write_plan(conn, the_plan, tables, method, prepared=True, stored=stored)
        cur = await conn.execute("SELECT id, owner, balance, events FROM accounts ORDER BY id")
        assert await cur.fetchall() == [("a", "bob", 7, 2), ("b", "ann", 5, 1)]
        await conn.execute("ALTER TABLE accounts ADD COLUMN note text NOT NULL DEFAULT ''")
        the_plan = plan([Upsert("accounts", {**whole, "id": "c"})], tables)
        await prepare_stages(conn, the_plan)
        async with conn.transaction():
            await write_plan(conn, the_plan, tables, method, prepared=True, stored=stored)
        cur = await conn.execute("SELECT id, owner, note FROM accounts WHERE id = 'c'")
        assert await cur.fetchall() == [("c", "ann", "")]


async def test_whole_rows_of_new_keys_are_copied_straight_in_and_a_stored_key_merges(
    database: DatabaseSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DirectCopy: new keys land by COPY into the table; a batch with a stored key is undone
    (its savepoint only: the same transaction's positions and other shapes stand) and merged
    as usual; that shape then waits before it is copied straight in again."""
    tables = PROJECTION.by_name
    direct = DirectCopy()
    row = {"id": "a", "owner": "ann", "balance": 5, "events": 1}
    landed: list[bool] = []
    copy_new_rows = writer._copy_new_rows

    async def spy(*args):
        landed.append(await copy_new_rows(*args))
        return landed[-1]

    monkeypatch.setattr(writer, "_copy_new_rows", spy)

    async def batch(conn, ops, moves) -> None:
        the_plan = plan(ops, tables)
        await prepare_stages(conn, the_plan)
        async with conn.transaction():
            await write_plan(conn, the_plan, tables, prepared=True, stored=stored, direct=direct)
            await move_positions(conn, "accounts", "events", moves)

    async with await connect(database) as conn:
        await ensure_schema(conn, PROJECTION)
        stored = await table_columns(conn, PROJECTION.tables)
        await load_positions(conn, "accounts", "events", [0])
        await batch(
            conn, [Upsert("accounts", row), Upsert("accounts", {**row, "id": "b"})], {0: (0, 2)}
        )
        assert landed == [True]
        added = Upsert(
            "accounts", {"id": "b", "balance": 1, "events": 1}, add=("balance", "events")
        )
        stored_key = Upsert("accounts", {**row, "owner": "bob"})
        await batch(conn, [stored_key, Upsert("accounts", {**row, "id": "c"}), added], {0: (2, 5)})
        assert landed == [True, False]
        cur = await conn.execute("SELECT id, owner, balance, events FROM accounts ORDER BY id")
        assert await cur.fetchall() == [("a", "bob", 5, 1), ("b", "ann", 6, 2), ("c", "ann", 5, 1)]
        assert await load_positions(conn, "accounts", "events", [0]) == {0: 5}
        await batch(conn, [Upsert("accounts", {**row, "id": "d"})], {0: (5, 6)})  # waits: 1 of 2
        await batch(conn, [Upsert("accounts", {**row, "id": "e"})], {0: (6, 7)})  # 2 of 2
        await batch(conn, [Upsert("accounts", {**row, "id": "f"})], {0: (7, 8)})  # tried again
        assert landed == [True, False, True]
        cur = await conn.execute("SELECT count(*) FROM accounts")
        assert await cur.fetchone() == (6,)


def test_a_refused_shape_waits_2_4_8_up_to_64_batches_and_a_landed_one_starts_over() -> None:
    direct = DirectCopy()
    shape = ("t", ("id", "v"), ())

    def skipped_after_a_refusal() -> int:
        direct.refused(shape)
        skipped = 0
        while not direct.worth_trying(shape):
            skipped += 1
        return skipped

    assert [skipped_after_a_refusal() for _ in range(7)] == [2, 4, 8, 16, 32, 64, 64]
    direct.landed(shape)
    assert skipped_after_a_refusal() == 2


@pytest.mark.parametrize("method", ["copy", "executemany"])
async def test_a_value_set_and_a_value_added_in_one_batch_merge_apart(
    database: DatabaseSettings, method: str
) -> None:
    """Two shapes of the same columns, one setting and one adding, each through its own stage:
    sharing one, the adding shape's merge applied the set rows again and counted them as found
    (so its new key was never inserted)."""
    counters = Table(
        "counters", ("id",), "CREATE TABLE {table} (id text PRIMARY KEY, n bigint NOT NULL)"
    )
    projection = SqlProjection("counting", lambda k, e: [], (counters,))
    tables = projection.by_name
    async with await connect(database) as conn:
        await ensure_schema(conn, projection)
        await conn.execute("INSERT INTO counters VALUES ('a', 5)")
        ops = [
            Upsert("counters", {"id": "a", "n": 2}),  # set: a stored key
            Upsert("counters", {"id": "b", "n": 3}, add=("n",)),  # add: a new key
        ]
        the_plan = plan(ops, tables)
        assert len(the_plan.upserts) == 2
        await prepare_stages(conn, the_plan)
        async with conn.transaction():
            await write_plan(conn, the_plan, tables, method, prepared=True)
        cur = await conn.execute("SELECT id, n FROM counters ORDER BY id")
        assert await cur.fetchall() == [("a", 2), ("b", 3)]


async def test_a_table_with_row_level_security_is_merged_not_copied_into(
    database: DatabaseSettings,
) -> None:
    """PostgreSQL refuses COPY FROM into a table with row-level security that applies to the
    writer: the rows are merged, and that table is never copied into again."""
    import uuid

    role = f"rls_{uuid.uuid4().hex[:8]}"
    tables = PROJECTION.by_name
    direct = DirectCopy()
    row = {"id": "a", "owner": "ann", "balance": 5, "events": 1}
    async with await connect(database) as conn:
        await ensure_schema(conn, PROJECTION)
        stored = await table_columns(conn, PROJECTION.tables)
        await conn.execute("ALTER TABLE accounts ENABLE ROW LEVEL SECURITY")
        await conn.execute(f"CREATE ROLE {role} NOLOGIN")
        try:
            await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON accounts TO {role}")
            await conn.execute(f"CREATE POLICY everything ON accounts TO {role} USING (true)")
            await conn.execute(f"SET ROLE {role}")
            for key in ("a", "b"):
                the_plan = plan([Upsert("accounts", {**row, "id": key})], tables)
                await prepare_stages(conn, the_plan)
                async with conn.transaction():
                    await write_plan(
                        conn, the_plan, tables, prepared=True, stored=stored, direct=direct
                    )
            shape = ("accounts", ("balance", "events", "id", "owner"), ())
            assert not any(direct.worth_trying(shape) for _ in range(100))  # not a backoff
            cur = await conn.execute("SELECT id FROM accounts ORDER BY id")
            assert await cur.fetchall() == [("a",), ("b",)]
        finally:
            await conn.execute("RESET ROLE")
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
