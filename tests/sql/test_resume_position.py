"""A commit unit that keeps the input position itself (a SQL projection's positions table):
the runner's lags and watchdog must read that position, not an empty store's -1; and a unit
that waits out its database's outage holds its tasks (not stuck).

Against the runner's fakes (tests/unit/test_runner_loop.py) and a fake commit unit: no
database, no broker. A restarted SQL task with nothing new to read is idle, not stuck.
"""

from __future__ import annotations

from pathlib import Path

from aiokafka import TopicPartition

from enhydra.runner.runner import TaskRunner
from enhydra.settings import Settings
from tests.unit.test_runner_loop import CHANGELOG, INPUT, Consumer, Reader, Step


class KeptPositions:
    """The part of a Checkpoint the assignment uses: open_task answers the stored position."""

    max_record_bytes = 1_000_000

    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = positions
        self.waiting: str | None = None  # why it waits for its database (SqlCommit.waiting)

    async def open_task(self, partition: int) -> int:
        return self.positions[partition]

    async def close_task(self, partition: int) -> None:
        pass

    async def commit(self, force: bool = False) -> None:
        pass


async def assigned(tmp_path: Path, positions: dict[int, int]) -> tuple[TaskRunner, Consumer]:
    """A fresh process (empty stores) assigned `positions`' partitions, its tasks restored."""
    settings = Settings.from_env(
        {}, app_id="sql", state_dir=tmp_path, partitions=len(positions), task_watchdog_ms=2000
    )
    runner = TaskRunner(
        settings,
        name="sql",
        group_id="sql",
        input_topic=INPUT,
        changelog_topic=CHANGELOG,
        step=Step(),
        output_topics=[],
        transactional_prefix="sql-",
    )
    consumer = Consumer(set())
    consumer.assigned = {TopicPartition(INPUT, p) for p in positions}
    runner.attach(consumer, KeptPositions(positions), Reader())  # type: ignore[arg-type]
    await runner._on_assigned(set(consumer.assigned))
    for task in list(runner.registry.tasks.values()):
        runner._on_restored(task)
    return runner, consumer


async def test_a_restarted_task_at_the_end_of_its_input_is_idle_not_stuck(tmp_path: Path) -> None:
    """The kill -9 test's restarted worker: every event already in the tables, none new."""
    runner, consumer = await assigned(tmp_path, {0: 40, 1: 0})
    assert consumer.seeks == {TopicPartition(INPUT, 0): 40, TopicPartition(INPUT, 1): 0}
    consumer.highwaters = {TopicPartition(INPUT, 0): 40, TopicPartition(INPUT, 1): 0}
    assert runner.input_lag() == {0: 0, 1: 0}
    runner._check_progress(100.0)
    runner._check_progress(100.0 + 3 * runner.registry.watchdog.limit_s)
    assert runner.registry.watchdog.stuck == {}
    runner.registry.close_all()


async def test_a_restarted_task_counts_only_what_follows_its_stored_position(
    tmp_path: Path,
) -> None:
    runner, consumer = await assigned(tmp_path, {0: 40})
    consumer.highwaters = {TopicPartition(INPUT, 0): 55}
    assert runner.input_lag() == {0: 15}
    runner.registry.close_all()


async def test_a_task_whose_commit_unit_waits_for_its_database_is_held_not_stuck(
    tmp_path: Path,
) -> None:
    """Records wait and nothing lands while the database is down: liveness must not fail (a
    restart brings no database back); `waiting` says why. Once it is back, the clock restarts."""
    runner, consumer = await assigned(tmp_path, {0: 10})
    consumer.highwaters = {TopicPartition(INPUT, 0): 50}
    unit = runner._checkpoint
    limit = runner.registry.watchdog.limit_s
    unit.waiting = "database unavailable: OperationalError: connection refused"  # type: ignore[union-attr]
    for t in range(6):
        runner._check_progress(100.0 + t * limit)
    assert runner.registry.watchdog.stuck == {}
    unit.waiting = None  # type: ignore[union-attr]
    runner._check_progress(100.0 + 6 * limit)
    runner._check_progress(100.0 + 8 * limit)  # back, and still not moving: stuck after all
    assert list(runner.registry.watchdog.stuck) == [0]
    runner.registry.close_all()
