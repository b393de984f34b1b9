"""`enhydra projection rebuild`: new tables filled from the events topic while the live ones
serve, swapped in one transaction. Real broker, real PostgreSQL; rows checked against the
independent model of the events (accounts.model)."""

from __future__ import annotations

import asyncio
import os
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.settings import Settings
from enhydra.sql import SqlProjection, Table
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from enhydra.sql.rebuild import Progress, Rebuild
from enhydra.sql.writer import PartitionLost
from tests.sql.accounts import ACCOUNTS, PROJECTION, history, model, produce
from tests.sql.test_sql_projection import REPO, caught_up, env_for, positions, table

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


async def oid(db: DatabaseSettings) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(db.conninfo()) as conn:
        cur = await conn.execute("SELECT 'accounts'::regclass::oid")
        return (await cur.fetchone())[0]  # type: ignore[index]


async def test_a_rebuild_while_events_flow_equals_the_live_tables_and_the_live_run_goes_on(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """Same version: the live engine keeps writing during the rebuild, waits out the swap, and
    goes on in the new tables from the same positions; every row equals the fold."""
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    first, second, third = (history(30, 15, seed=s) for s in (11, 12, 13))
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, first)
        await caught_up(database, kafka_bootstrap, topic)
        before = await oid(database)
        progress: list[Progress] = []
        rebuild = Rebuild(
            settings, database, PROJECTION, topic, batch_records=50, on_progress=progress.append
        )
        flowing = asyncio.ensure_future(produce(kafka_bootstrap, topic, second))
        await rebuild.run()
        await flowing
        assert await oid(database) != before  # the rebuilt tables were swapped in
        assert rebuild.folded >= len(first)
        assert {p.phase for p in progress} >= {"fill"}
        await produce(kafka_bootstrap, topic, third)
        await caught_up(database, kafka_bootstrap, topic)
        assert engine.failure is None
    finally:
        await engine.stop()
    assert await table(database) == model(first + second + third)


async def test_a_rebuild_of_a_transactional_events_topic_ends_at_the_live_positions(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """Events written under exactly_once end each transaction with a marker, an offset with no
    record, which the live positions are past. The rebuild ends at those positions, markers
    included: one record short, the live writers would find their positions moved and stop."""
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    first, second = (history(20, 10, seed=s) for s in (21, 22))
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, first, transactions=25)
        await caught_up(database, kafka_bootstrap, topic)
        live = await positions(database, PROJECTION.positions_key)
        rebuild = Rebuild(settings, database, PROJECTION, topic, batch_records=40)
        assert await rebuild.run() == live
        await produce(kafka_bootstrap, topic, second, transactions=25)
        await caught_up(database, kafka_bootstrap, topic)
        assert engine.failure is None
    finally:
        await engine.stop()
    assert await table(database) == model(first + second)


async def test_an_interrupted_rebuild_of_a_new_version_resumes_and_fences_the_old_writers(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events, later = history(40, 15, seed=14), history(5, 3, seed=15)
    newer = SqlProjection(PROJECTION.name, PROJECTION.project, (ACCOUNTS,), version=2)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, events)
        await caught_up(database, kafka_bootstrap, topic)

        def interrupt(progress: Progress) -> None:
            if progress.folded >= 100:
                raise KeyboardInterrupt  # an operator's Ctrl-C

        stopped = Rebuild(settings, database, newer, topic, batch_records=50, on_progress=interrupt)
        with pytest.raises(KeyboardInterrupt):
            await stopped.run()
        resumed = Rebuild(settings, database, newer, topic, batch_records=50)
        await resumed.run()
        assert stopped.folded + resumed.folded == len(events)  # nothing folded twice
        assert await table(database) == model(events)
        await produce(kafka_bootstrap, topic, later)  # the old version's writer is fenced
        for _ in range(200):
            if engine.failure is not None:
                break
            await asyncio.sleep(0.1)
        assert isinstance(engine.failure, PartitionLost), engine.failure
    finally:
        await engine.stop()
    assert await table(database) == model(events)  # its batch left nothing
    successor = SqlProjectionEngine(settings, newer, topic, database=database)
    await successor.start()
    try:
        await caught_up(database, kafka_bootstrap, topic, key=newer.positions_key)
    finally:
        await successor.stop()
    assert await table(database) == model(events + later)


@pytest.mark.parametrize("change", ["ddl", "no digest"])
async def test_an_interrupted_rebuild_starts_over_when_its_tables_may_have_another_ddl(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings, change: str
) -> None:
    """Resuming keeps the half-filled tables; it may only when they were made from this DDL."""
    import psycopg

    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(30, 12, seed=16)
    await ensure_topics(settings.connection, [TopicSpec(topic, 4)])
    await produce(kafka_bootstrap, topic, events)
    newer = SqlProjection(PROJECTION.name, PROJECTION.project, (ACCOUNTS,), version=2)

    def interrupt(progress: Progress) -> None:
        if progress.folded >= 60:
            raise KeyboardInterrupt

    stopped = Rebuild(settings, database, newer, topic, batch_records=30, on_progress=interrupt)
    with pytest.raises(KeyboardInterrupt):
        await stopped.run()
    if change == "ddl":  # the same version, a table changed in between (a wider CHECK)
        widened = ACCOUNTS.ddl.replace("<= 12", "<= 40")
        table_now = Table(ACCOUNTS.name, ACCOUNTS.key, widened)
        newer = SqlProjection(PROJECTION.name, PROJECTION.project, (table_now,), version=2)
    else:  # the marker as code before the digest wrote it
        async with await psycopg.AsyncConnection.connect(database.conninfo()) as conn:
            await conn.execute(
                "UPDATE enhydra_sql_schemas SET ddl_digest = NULL WHERE projection LIKE %s",
                (f"{PROJECTION.name}~rebuild",),
            )
            await conn.commit()
    restarted = Rebuild(settings, database, newer, topic, batch_records=30)
    await restarted.run()
    assert stopped.folded >= 60
    assert restarted.folded == len(events)  # filled again from the start, not resumed
    assert await table(database) == model(events)
    async with await psycopg.AsyncConnection.connect(database.conninfo()) as conn:
        cur = await conn.execute(
            "SELECT version, ddl_digest FROM enhydra_sql_schemas WHERE projection = %s",
            (PROJECTION.name,),
        )
        assert await cur.fetchone() == (2, newer.ddl_digest)


async def test_the_command_rebuilds_and_says_so_and_refuses_an_unknown_name_in_one_line(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(20, 10, seed=16)
    env = {
        **os.environ,
        **env_for(kafka_bootstrap, app_id, tmp_path / "state"),
        "ENHYDRA_DATABASE_URL": database.url,
        "ENHYDRA_DATABASE_PASSWORD_FILE": str(database.password_file),
        "PYTHONPATH": str(REPO),
    }

    async def command(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "enhydra.cli.main", "projection", "rebuild", *args,
            env=env, cwd=REPO, stdout=PIPE, stderr=PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, _, err = await command("tests.sql.accounts:SERVICE", "balances")
    assert code == 1
    assert err.strip() == (
        "Error: tests.sql.accounts:SERVICE has no SQL projection 'balances' "
        "(its SQL projections: accounts)"
    )
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, events)
        await caught_up(database, kafka_bootstrap, topic)
        before = await oid(database)
        code, out, err = await command("tests.sql.accounts:SERVICE", "accounts")
        assert code == 0, err
        assert f"{len(events):,} events folded" in out, out
        assert "Traceback" not in err, err
        assert await oid(database) != before
        await produce(kafka_bootstrap, topic, history(5, 3, seed=17))
        await caught_up(database, kafka_bootstrap, topic)
    finally:
        await engine.stop()
    assert await table(database) == model(events + history(5, 3, seed=17))


async def test_a_rebuild_on_an_empty_database_builds_the_tables_the_live_engine_then_uses(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """No live tables yet (a projection added to a service with history): the rebuild fills
    them up to the topic's end, and the engine resumes where it ended, folding nothing twice."""
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    history_events, new = history(30, 10, seed=18), history(5, 4, seed=19)
    spec = TopicSpec(topic, settings.partitions, history=True)
    await ensure_topics(settings.connection, [spec], client_id="test")
    await produce(kafka_bootstrap, topic, history_events)
    rebuild = Rebuild(settings, database, PROJECTION, topic, batch_records=100)
    await rebuild.run()
    assert rebuild.folded == len(history_events)
    assert await table(database) == model(history_events)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, new)
        await caught_up(database, kafka_bootstrap, topic)
    finally:
        await engine.stop()
    assert engine.stats["processed"] == len(new)
    assert await table(database) == model(history_events + new)
