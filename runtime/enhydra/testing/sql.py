"""A real PostgreSQL for tests: Debian's server in a temp folder, started once per session.

Fixtures for a service's tests and this repository's (import them into a conftest.py or a
test module: `from enhydra.testing.sql import database, postgres`), and `fold_rows`, which
runs a projection's rows through the real write path. initdb and pg_ctl run as the
`postgres` user when the tests run as root; the server takes a password (scram), handed over
in a password file as in production. A machine without the server gets it from apt-get when
the tests run as root (as CI does).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from enhydra.devtools.postgres import PASSWORD, Postgres, find_server_bin, temporary_server
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.model import SqlProjection

__all__ = ["PASSWORD", "Postgres", "database", "find_server_bin", "fold_rows", "postgres"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server for the session (fsync off: the tests kill processes, not machines)."""
    pytest.importorskip("psycopg", reason="the postgres extra: pip install -e '.[postgres]'")
    try:
        find_server_bin()  # missing, and not installable here: one line
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with temporary_server() as server:
        yield server


@pytest.fixture
def database(postgres: Postgres):
    """A fresh database of the session server: DatabaseSettings with the password file."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = DatabaseSettings(postgres.url(), postgres.password_file)
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return DatabaseSettings(postgres.url(name), postgres.password_file)


async def fold_rows(
    database: DatabaseSettings, projection: SqlProjection, events: Iterable[tuple[str, dict]]
) -> dict[str, list[dict[str, Any]]]:
    """Create the projection's tables, write the rows `project` returns for `events` (in order,
    one transaction, as a batch of the live projection) and return every table's rows in key
    order: a test that the DDL, `project` and the database's constraints agree."""
    import psycopg
    from psycopg.rows import dict_row

    from enhydra.sql import writer
    from enhydra.sql.rows import plan

    ops = [op for key, event in events for op in projection.check(projection.project(key, event))]
    async with await psycopg.AsyncConnection.connect(database.conninfo(), autocommit=True) as conn:
        await writer.ensure_schema(conn, projection)
        async with conn.transaction():
            await writer.write_plan(conn, plan(ops, projection.by_name), projection.by_name)
        tables: dict[str, list[dict[str, Any]]] = {}
        for table in projection.tables:
            order = ", ".join(f'"{c}"' for c in table.key)
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(f'SELECT * FROM "{table.name}" ORDER BY {order}')
                tables[table.name] = await cur.fetchall()
        return tables
