"""`make run` of a generated service: with a SQL projection it reuses or starts the local
PostgreSQL (`enhydra postgres start`) and hands it to the service as ENHYDRA_DATABASE_URL;
without one it starts none. The real Makefile runs; the service's python is a stand-in that
records the environment it was given (the service itself is tested elsewhere)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from enhydra.devtools.postgres import running, stop
from enhydra.sql.config import DatabaseSettings
from tests.template.support import clean_env, enhydra, enhydra_new

pytestmark = [pytest.mark.template, pytest.mark.integration, pytest.mark.slow]

FAKE_PYTHON = """#!/bin/sh
# `python -m enhydra.spark.jars` (make setup): nothing to do; `python -m PKG`: the service.
[ "$2" = enhydra.spark.jars ] && exit 0
env | grep '^ENHYDRA_' > "$RECORD"
"""


def make_run(project: Path, fake: Path, record: Path, pg_dir: Path) -> dict[str, str]:
    stamp = project / ".installed"
    stamp.touch()  # newer than pyproject.toml: make setup installs nothing
    env = clean_env(project.parent, RECORD=str(record), ENHYDRA_POSTGRES_DIR=str(pg_dir))
    for name in ("ENHYDRA_DATABASE_URL", "ENHYDRA_DATABASE_PASSWORD_FILE", "MAKEFLAGS"):
        env.pop(name, None)
    done = subprocess.run(
        [
            "make",
            "run",
            f"PY={fake}",
            f"STAMP={stamp}",
            f"ENHYDRA={Path(sys.executable).parent / 'enhydra'}",
            "BOOTSTRAP=127.0.0.1:9",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = record.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_make_run_starts_postgres_for_a_sql_projection_once_and_none_without(
    tmp_path: Path,
) -> None:
    made = enhydra_new(tmp_path / "out", "project_name=Tool Shed")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "out" / "tool-shed"
    fake, record = tmp_path / "python", tmp_path / "env.txt"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    pg_dir = Path(tempfile.mkdtemp(prefix="enhydra-dev-pg-")) / "postgres"  # reachable as root
    pg_dir.parent.chmod(0o755)
    try:
        given = make_run(project, fake, record, pg_dir)
        assert given["ENHYDRA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9"
        assert "ENHYDRA_DATABASE_URL" not in given  # no SQL projection: no server
        assert running(pg_dir) is None and not pg_dir.exists()

        generated = enhydra(project, "generate", "projection", "tool_counts", "--sql")
        assert generated.returncode == 0, generated.stdout + generated.stderr
        given = make_run(project, fake, record, pg_dir)
        server = running(pg_dir)
        assert server is not None
        assert given["ENHYDRA_DATABASE_URL"] == server.url
        database = DatabaseSettings(
            given["ENHYDRA_DATABASE_URL"], Path(given["ENHYDRA_DATABASE_PASSWORD_FILE"])
        )
        import psycopg

        with psycopg.connect(database.conninfo()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)

        again = make_run(project, fake, record, pg_dir)  # the running server, not a second one
        assert again == given and running(pg_dir) == server
    finally:
        stop(pg_dir)
        shutil.rmtree(pg_dir.parent, ignore_errors=True)
