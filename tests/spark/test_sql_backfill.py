"""`enhydra backfill --sql-projection`: a SQL projection's tables filled on Spark executors with
its own `project`, swapped in by the rebuild's code, and the live projection going on exactly
after the positions the backfill stored. Real broker, real PostgreSQL, Spark local[2]; rows
checked against the independent model of the events (tests/sql/accounts.model)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("pyspark")

from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.settings import Settings
from enhydra.spark.job import (
    BackfillError,
    BackfillResult,
    execute_backfill,
    plan_backfill,
    summary,
)
from enhydra.sql.config import PASSWORD_FILE_VAR, URL_VAR, DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from enhydra.testing.sql import database, postgres
from tests.sql import accounts
from tests.sql.accounts import PROJECTION, history, model, produce
from tests.sql.test_sql_projection import (
    PARTITIONS,
    caught_up,
    end_offsets,
    env_for,
    positions,
    table,
)

__all__ = ["database", "postgres"]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.timeout(300),
]

TARGET = "tests.sql.accounts:SERVICE"


def service_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], database: DatabaseSettings
) -> None:
    """The service's settings and the database as a deployed job reads them: ENHYDRA_*."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(URL_VAR, database.url)
    monkeypatch.setenv(PASSWORD_FILE_VAR, str(database.password_file))
    monkeypatch.setattr(accounts.SERVICE, "_settings", None)  # read them again


def backfill(spark: Any, app_id: str) -> BackfillResult:
    """The job as `enhydra backfill TARGET --sql-projection accounts` runs it (sync: a thread)."""
    plan = plan_backfill(TARGET, app_id=app_id, sql_projection="accounts")
    return execute_backfill(spark, plan)


async def test_backfilled_tables_equal_the_fold_and_the_live_projection_goes_on_after_them(
    kafka_bootstrap: str,
    app_id: str,
    tmp_path: Path,
    database: DatabaseSettings,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = env_for(kafka_bootstrap, app_id, tmp_path / "state")
    service_env(monkeypatch, env, database)
    settings = Settings.from_env(env)
    topic = f"{app_id}-events"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS, history=True)])
    first = history(40, 12, seed=21, bad=2)
    later = history(10, 5, seed=22)
    last = history(10, 5, seed=23)
    await produce(kafka_bootstrap, topic, first)

    result = await asyncio.to_thread(backfill, spark, app_id)

    assert await table(database) == model(first)
    ends = await end_offsets(kafka_bootstrap, topic)
    assert await positions(database) == ends  # the live projection resumes after them
    assert result.sql is not None
    assert result.sql["folded"] == len(first) and result.sql["refused"] == 2
    assert "sql projection accounts (version 1)" in summary(result)

    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, later)
        await caught_up(database, kafka_bootstrap, topic)
        assert await table(database) == model(first + later)  # nothing folded twice
        # the same version again, while the live engine writes: up to its positions, then
        # the swap folds what it wrote meanwhile; the engine goes on in the new tables
        flowing = asyncio.ensure_future(produce(kafka_bootstrap, topic, last))
        again = await asyncio.to_thread(backfill, spark, app_id)
        await flowing
        await caught_up(database, kafka_bootstrap, topic)
        assert engine.failure is None
    finally:
        await engine.stop()
    assert again.sql is not None and again.sql["folded"] >= len(first + later)
    assert await table(database) == model(first + later + last)


def test_an_unknown_sql_projection_is_one_line_before_spark(
    kafka_bootstrap: str,
    app_id: str,
    tmp_path: Path,
    database: DatabaseSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service_env(monkeypatch, env_for(kafka_bootstrap, app_id, tmp_path / "state"), database)
    with pytest.raises(BackfillError, match=r"no SQL projection 'balances'.*accounts"):
        plan_backfill(TARGET, app_id=app_id, sql_projection="balances")
    monkeypatch.delenv(URL_VAR)
    with pytest.raises(BackfillError, match="ENHYDRA_DATABASE_URL is not set"):
        plan_backfill(TARGET, app_id=app_id, sql_projection="accounts")
