"""A real PostgreSQL for tests: Debian's server in a temp folder, started once per session.

Fixtures for a service's tests and this repository's (import them into a conftest.py or a
test module: `from enhydra.sql.testing import database, postgres`), and `fold_rows`, which
runs a projection's rows through the real write path. initdb and pg_ctl run as the
`postgres` user when the tests run as root; the server takes a password (scram), handed over
in a password file as in production. A machine without the server gets it from apt-get when
the tests run as root (as CI does).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from enhydra.sql.config import DatabaseSettings
from enhydra.sql.model import SqlProjection


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PASSWORD = "enhydra-test-password"


def find_server_bin() -> Path:
    """The folder of Debian's PostgreSQL server programs, installed first when missing (root)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    if os.geteuid() != 0:
        raise RuntimeError(
            "PostgreSQL is missing and only root can install it: apt-get install postgresql"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
        check=True,
        env=env,
        timeout=900,
    )
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    assert found, "apt-get installed postgresql but initdb is not in /usr/lib/postgresql"
    return Path(found[-1]).parent


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Postgres:
    """One server in a temp folder; stop() and start() simulate an outage."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.password_file = root / "password"

    def init(self) -> None:
        pwfile = self.root / "initpw"
        pwfile.write_text(PASSWORD)
        self.password_file.write_text(PASSWORD + "\n")
        self.password_file.chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(pwfile, "postgres")
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "enhydra",
                    f"--pwfile={pwfile}",
                    "-A",
                    "scram-sha-256",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        pwfile.unlink()

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60"
        )
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    options,
                    "-l",
                    str(self.root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]
            ),
            check=False,
            capture_output=True,
            timeout=90,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://enhydra@127.0.0.1:{self.port}/{database}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server for the session (fsync off: the tests kill processes, not machines)."""
    pytest.importorskip("psycopg", reason="the postgres extra: pip install -e '.[postgres]'")
    root = Path(tempfile.mkdtemp(prefix="enhydra-pg-"))
    root.chmod(0o755)
    try:
        server = Postgres(find_server_bin(), root)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


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
