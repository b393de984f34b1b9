"""SQL projections against a real broker and a real PostgreSQL: exactly once, whatever fails.

Each test checks the tables against an independent model of the events (accounts.model):
balances and event counts are sums, so an event folded twice or lost shows.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from aiokafka import AIOKafkaConsumer, TopicPartition

from enhydra.settings import Settings
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from enhydra.testing.processes import service_env
from tests.sql.accounts import PROJECTION, history, model, produce

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.timing,
]


def env_for(bootstrap: str, app_id: str, state: Path, **extra: str) -> dict[str, str]:
    env = service_env(
        app_id=app_id,
        bootstrap=bootstrap,
        instance_id="i1",
        state_dir=state,
        partitions=PARTITIONS,
        extra={"ENHYDRA_MAX_BATCH_RECORDS": "100", "ENHYDRA_TASK_WATCHDOG_MS": "60000", **extra},
    )
    return env


async def table(db: DatabaseSettings) -> dict[str, tuple[str, int, int]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(db.conninfo()) as conn:
        cur = await conn.execute("SELECT id, owner, balance, events FROM accounts")
        return {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}


async def positions(db: DatabaseSettings, key: str = PROJECTION.positions_key) -> dict[int, int]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(db.conninfo()) as conn:
        cur = await conn.execute(
            "SELECT partition, next_offset FROM enhydra_sql_positions WHERE projection = %s",
            (key,),
        )
        return dict(await cur.fetchall())


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def caught_up(
    db: DatabaseSettings,
    bootstrap: str,
    topic: str,
    timeout: float = 120,
    key: str = PROJECTION.positions_key,
) -> None:
    ends = await end_offsets(bootstrap, topic)
    deadline = time.monotonic() + timeout
    last: dict[int, int] = {}
    while time.monotonic() < deadline:
        try:
            last = await positions(db, key)
        except Exception:  # the tables may not exist yet, or the server restarts
            last = {}
        if all(last.get(p, 0) >= end for p, end in ends.items()):
            return
        await asyncio.sleep(0.3)
    pytest.fail(f"the projection did not reach the end of {topic}: {last} < {ends}")


async def dead_letters(bootstrap: str, topic: str, count: int) -> list:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    found: list = []
    try:
        deadline = time.monotonic() + 60
        while len(found) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                found += records
    finally:
        await consumer.stop()
    return found


async def test_rows_equal_the_fold_and_a_restart_resumes_from_the_database(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """Kafka's committed offsets are never written: the second start reads from the stored
    positions on (it reads only the new events), and folds nothing twice. Both write methods
    run, one per start."""
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    first, second = history(30, 12, seed=1), history(30, 12, seed=2)
    for method, events in (("copy", first), ("executemany", second)):
        engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database, method=method)
        await engine.start()
        try:
            await produce(kafka_bootstrap, topic, events)
            await caught_up(database, kafka_bootstrap, topic)
        finally:
            await engine.stop()
        assert engine.stats["processed"] == len(events)
    assert await table(database) == model(first + second)


async def test_a_refused_row_goes_to_the_dlq_and_the_projection_goes_on(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(20, 10, seed=3, bad=3)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, events)
        await caught_up(database, kafka_bootstrap, topic)
        assert engine.describe()["dead_lettered"] == 3
    finally:
        await engine.stop()
    assert await table(database) == model(events)
    letters = await dead_letters(kafka_bootstrap, settings.dlq_topic, 3)
    assert sorted(r.key.decode() for r in letters) == [f"bad-3-{i}" for i in range(3)]
    for letter in letters:
        headers = dict(letter.headers)
        assert b"violates check constraint" in headers["enhydra.dlq.error.message"]
        assert headers["enhydra.dlq.topic"] == topic.encode()


async def test_the_database_down_pauses_the_projection_and_loses_nothing(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings, postgres
) -> None:
    """Down 30 s (the issue's outage; 15 task watchdog limits) while events flow: the tasks are
    held (not stuck: liveness holds), /v1/stats says why, and nothing is lost or doubled."""
    from enhydra.query.metadata import projections_report

    env = env_for(kafka_bootstrap, app_id, tmp_path / "state", ENHYDRA_TASK_WATCHDOG_MS="2000")
    settings = Settings.from_env(env)
    topic = f"{app_id}-events"
    before, during = history(20, 10, seed=4), history(20, 10, seed=5)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, before)
        await caught_up(database, kafka_bootstrap, topic)
        await asyncio.to_thread(postgres.stop, "fast")
        try:
            await produce(kafka_bootstrap, topic, during)
            deadline = time.monotonic() + 60
            while not engine.describe()["waiting"] and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(30)  # the batch retried many times meanwhile
            stats = projections_report({"accounts": engine})["accounts"]
            assert stats["waiting"].startswith("database unavailable"), stats
            assert stats["lag"] > 0, stats
            assert engine.registry.watchdog.trips == 0, engine.registry.watchdog.stuck
        finally:
            await asyncio.to_thread(postgres.start)
        await caught_up(database, kafka_bootstrap, topic)
        assert engine.failure is None
        assert engine.describe()["waiting"] is None
    finally:
        await engine.stop()
    assert await table(database) == model(before + during)


class _LostAfterCommit(dict):
    """SqlCommit.stats whose first update after a batch's commit fails as a connection lost
    at that moment would: the transaction committed, the client never heard."""

    def __init__(self, stats: dict) -> None:
        super().__init__(stats)
        self.armed = True

    def __setitem__(self, key: str, value: int) -> None:
        if key == "rows" and self.armed:
            self.armed = False
            import psycopg

            raise psycopg.OperationalError("server closed the connection unexpectedly")
        super().__setitem__(key, value)


async def test_a_commit_whose_answer_was_lost_is_not_written_again(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """The connection drops between the server's commit and the client hearing it: the batch
    is retried, the retry finds its positions already moved (committed after all) and writes
    nothing; written again, every `add` of the batch would count twice."""
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(20, 10, seed=9)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        assert engine.sql is not None
        stats = engine.sql.stats = _LostAfterCommit(engine.sql.stats)
        await produce(kafka_bootstrap, topic, events)
        await caught_up(database, kafka_bootstrap, topic)
        assert not stats.armed  # the answer of one commit was lost
        assert stats["db_retries"] >= 1
        assert engine.failure is None
    finally:
        await engine.stop()
    assert await table(database) == model(events)


async def test_a_previous_owner_folding_ahead_is_read_past_not_a_failure(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """Around a rebalance the previous owner's last batch can commit after this instance read
    the position (a zombie). Here the test is that previous owner: it holds the table while the
    engine's next batch waits, folds that batch's first events itself and moves the position.
    The engine's batch then finds the position moved: it must read on from there, folding each
    event once. Before: PartitionLost, and the instance stopped."""
    import orjson
    import psycopg

    from enhydra.sql import writer
    from enhydra.sql.fold import EventRows

    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(24, 8, seed=21)
    first, then = events[:120], events[120:]
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    zombie = await psycopg.AsyncConnection.connect(database.conninfo())
    try:
        await produce(kafka_bootstrap, topic, first)
        await caught_up(database, kafka_bootstrap, topic)
        start = await positions(database)
        await zombie.execute("LOCK TABLE accounts IN EXCLUSIVE MODE")
        await produce(kafka_bootstrap, topic, then)
        ends = await end_offsets(kafka_bootstrap, topic)
        partition = max(ends, key=lambda p: ends[p] - start[p])
        for _ in range(300):  # the engine's batch waits for the table
            cur = await zombie.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if (await cur.fetchone())[0]:  # type: ignore[index]
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the engine never tried to write the second batch")
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start[partition])
            fetched = (await consumer.getmany(tp, timeout_ms=5000, max_records=5)).get(tp, [])
        finally:
            await consumer.stop()
        assert fetched and fetched[0].offset == start[partition]
        folded = [
            EventRows(r, PROJECTION.project(r.key.decode(), orjson.loads(r.value))) for r in fetched
        ]
        moved = {partition: (start[partition], fetched[-1].offset + 1)}
        await writer.write_batch(zombie, PROJECTION, PROJECTION.positions_key, topic, moved, folded)
        await zombie.commit()  # the previous owner's late batch lands first
        await caught_up(database, kafka_bootstrap, topic, timeout=60)
        assert engine.failure is None
        assert await positions(database) == ends
    finally:
        await zombie.close()
        await engine.stop()
    assert await table(database) == model(events)


async def test_kill_9_mid_transaction_leaves_every_row_equal_to_the_fold(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    """Events arrive in waves, one before each kill, so every restarted worker has work to be
    killed in (a worker quicker than the producer drains a single wave before the first kill).
    The last worker ends idle at the end of the topic: idle is not stuck (its watchdog reads
    the position the database resumed it at, not its empty store)."""
    topic = f"{app_id}-events"
    events = history(60, 25, seed=6)
    cuts = [len(events) * n // 4 for n in range(5)]  # four waves, in the history's order
    env = {
        **os.environ,
        **env_for(
            kafka_bootstrap,
            app_id,
            tmp_path / "state",
            ENHYDRA_MAX_BATCH_RECORDS="20",
            ENHYDRA_TASK_WATCHDOG_MS="2000",
        ),
        "ENHYDRA_DATABASE_URL": database.url,
        "ENHYDRA_DATABASE_PASSWORD_FILE": str(database.password_file),
        "TEST_EVENTS_TOPIC": topic,
        "PYTHONPATH": str(REPO),
    }
    rng = random.Random(6)
    log_path = tmp_path / "worker.log"

    def worker() -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(
            [sys.executable, "-m", "tests.sql.sql_worker"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    async def moved() -> int:
        try:
            return sum((await positions(database)).values())
        except Exception:  # the tables may not exist yet
            return 0

    proc = worker()
    try:
        for n in range(3):
            seen = await moved()
            await produce(kafka_bootstrap, topic, events[cuts[n] : cuts[n + 1]])
            deadline = time.monotonic() + 60
            while await moved() <= seen:  # it is writing batches now: kill it at a random point
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                await asyncio.sleep(0.05)
            await asyncio.sleep(rng.uniform(0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            proc = worker()
        await produce(kafka_bootstrap, topic, events[cuts[3] :])
        await caught_up(database, kafka_bootstrap, topic, timeout=150)
        await asyncio.sleep(3)  # idle at the end longer than the watchdog's limit
        assert "task stuck" not in log_path.read_text(), log_path.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert await table(database) == model(events)
