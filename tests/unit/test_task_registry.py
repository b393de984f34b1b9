"""The task registry and the progress watchdog: plain bookkeeping, no Kafka client.

The registry's `access` is the one rule behind every read (keys, scans, projections): these
tests walk it through the states a task goes through in a rebalance.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from enhydra.assignment.protocol import MemberAssignment
from enhydra.query.http import build_app
from enhydra.runner.registry import TaskRegistry, Verdict
from enhydra.runner.tasks import Role, TaskStatus
from enhydra.runner.watchdog import Watchdog
from enhydra.settings import Settings


@pytest.fixture
def registry(tmp_path: Path):
    settings = Settings.from_env({}, app_id="reg", state_dir=tmp_path, partitions=4)
    lags = {0: 0, 1: 7, 2: 3, 3: 0}
    made = TaskRegistry(
        settings,
        tmp_path / "store",
        new_cache=lambda: None,
        changelog_lag=lambda partition, checkpoint: lags.get(partition),
        watchdog_s=5,
    )
    yield made
    made.close_all()


def test_access_follows_a_task_through_a_rebalance(registry: TaskRegistry) -> None:
    assert registry.access(0).verdict is Verdict.NOT_HOSTED and not registry.access(0).settled
    change = registry.assign({0, 1}, MemberAssignment(standby=frozenset({2})))
    assert change.active == [0, 1] and change.closed_active == []
    assert registry.access(0).verdict is Verdict.UNAVAILABLE  # restoring
    assert "restored" in registry.access(0).reason
    assert registry.restored(registry.tasks[0])
    served = registry.access(0)
    assert served.verdict is Verdict.SERVE and served.store is registry.tasks[0].store
    # A standby answers only when a stale read is asked for, with its lag.
    assert registry.access(2).verdict is Verdict.NOT_HOSTED
    stale = registry.access(2, allow_stale=True)
    assert stale.verdict is Verdict.STALE and stale.lag == 3
    assert registry.access(3).verdict is Verdict.NOT_HOSTED and registry.access(3).settled
    # A rebalance begins: nothing is served as current, revoked tasks are suspended.
    registry.suspend({0})
    assert registry.tasks[0].status is TaskStatus.SUSPENDED
    assert registry.access(0).verdict is Verdict.UNAVAILABLE
    assert not registry.access(3).settled
    # Stopping: not even a stale read (the group may have moved the task already).
    registry.rebalancing = False
    registry.stopping = True
    assert registry.access(2, allow_stale=True).verdict is Verdict.NOT_HOSTED


def test_an_assignment_closes_and_demotes_what_left(registry: TaskRegistry) -> None:
    registry.assign({0, 1}, MemberAssignment())
    for task in list(registry.tasks.values()):
        registry.restored(task)
    change = registry.assign({1}, MemberAssignment(standby=frozenset({0})))
    assert change.closed_active == [0]
    assert registry.tasks[0].role is Role.STANDBY and registry.tasks[0].status is TaskStatus.RUNNING
    assert registry.tasks[1].status is TaskStatus.RESTORING  # restores again: may have changed
    registry.assign(set(), MemberAssignment())
    assert registry.tasks == {} and set(registry.disk_checkpoints) == {0, 1}
    assert registry.rebalances == 3


def test_the_join_report_counts_local_copies_and_running_actives(registry: TaskRegistry) -> None:
    registry.assign({0, 1}, MemberAssignment(standby=frozenset({2})))
    registry.restored(registry.tasks[1])
    report = registry.report()
    assert report.active == frozenset({0, 1}) and report.standby == frozenset({2})
    assert report.lags[1] == 0  # running active: it writes its changelog
    assert report.lags[0] == 0 and report.lags[2] == 3


def test_the_watchdog_trips_once_per_episode() -> None:
    dog = Watchdog(10)
    assert dog.observe(0, 0.0, phase="processing", position=5, waiting=9) is None
    assert dog.observe(0, 9.0, phase="processing", position=5, waiting=9) is None
    stuck = dog.observe(0, 10.5, phase="processing", position=5, waiting=9)
    assert stuck is not None and stuck.seconds == 10.5
    assert dog.observe(0, 20.0, phase="processing", position=5, waiting=9) is None  # same episode
    assert dog.stuck[0].seconds == 20.0 and dog.trips == 1
    dog.observe(0, 21.0, phase="processing", position=6, waiting=8)  # progress
    assert dog.stuck == {}
    dog.observe(0, 40.0, phase="processing", position=6, waiting=8)
    assert dog.trips == 2
    dog.forget(set())
    assert dog.stuck == {}


@given(
    st.lists(
        st.tuples(st.floats(0, 3), st.booleans(), st.integers(0, 3), st.booleans()),
        max_size=40,
    )
)
def test_the_watchdog_never_reports_a_task_that_moved_or_had_nothing_waiting(steps) -> None:
    """Stuck means: work waited at every look for the whole limit, and the position held."""
    dog = Watchdog(5)
    now, position, quiet_since = 0.0, 0, 0.0
    for i, (gap, moves, waiting, held) in enumerate(steps):
        now += gap
        if moves:
            position += 1
        if i == 0 or moves or held or not waiting:  # the first look starts the clock
            quiet_since = now
        dog.observe(0, now, phase="processing", position=position, waiting=waiting, held=held)
        assert (0 in dog.stuck) == (now - quiet_since >= 5)


def test_a_stuck_task_fails_the_liveness_probe_and_says_which(registry: TaskRegistry) -> None:
    """/health/live is what an orchestrator restarts on: a stuck task must fail it, by name."""
    registry.assign({0}, MemberAssignment())
    registry.restored(registry.tasks[0])
    engine = SimpleNamespace(registry=registry, stopping=False, settings=registry.settings)

    async def scenario() -> tuple[int, dict, int]:
        app = build_app(lambda: engine, "i1", "accounts", settings=registry.settings)
        async with TestClient(TestServer(app)) as client:
            healthy = (await client.get("/health/live")).status
            registry.watchdog.observe(0, 0.0, phase="processing", position=4, waiting=12)
            registry.watchdog.observe(0, 30.0, phase="processing", position=4, waiting=12)
            answer = await client.get("/health/live")
            return healthy, await answer.json(), answer.status

    healthy, body, status = asyncio.run(scenario())
    assert healthy == 200
    assert status == 503 and body["code"] == "unavailable"
    assert "partition 0 made no processing progress for 30s" in body["stuck"]["0"]


def test_a_stuck_projection_or_reaction_fails_the_liveness_probe_too(
    registry: TaskRegistry, tmp_path: Path
) -> None:
    """Every runner of the instance counts, not only the aggregate's: a read model that stopped
    moving is as much a reason to restart as a stuck command partition."""
    other = TaskRegistry(
        registry.settings,
        tmp_path / "projection-store",
        new_cache=lambda: None,
        changelog_lag=lambda partition, checkpoint: 0,
        watchdog_s=5,
    )
    other.assign({2}, MemberAssignment())
    engine = SimpleNamespace(registry=registry, stopping=False, settings=registry.settings)
    projection = SimpleNamespace(name="balances", registry=other)

    async def scenario() -> tuple[int, dict, int]:
        app = build_app(
            lambda: engine,
            "i1",
            "accounts",
            settings=registry.settings,
            runners=lambda: [engine, projection],
        )
        async with TestClient(TestServer(app)) as client:
            healthy = (await client.get("/health/live")).status
            other.watchdog.observe(2, 0.0, phase="processing", position=9, waiting=3)
            other.watchdog.observe(2, 30.0, phase="processing", position=9, waiting=3)
            answer = await client.get("/health/live")
            return healthy, await answer.json(), answer.status

    try:
        healthy, body, status = asyncio.run(scenario())
    finally:
        other.close_all()
    assert healthy == 200
    assert status == 503 and list(body["stuck"]) == ["balances:2"]
