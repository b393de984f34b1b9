"""The task registry: which partitions this instance holds, in which role, and how fresh.

The runner's loop (runner.py) polls, runs the step and lands batches; this registry is the
other half, the one that changes with the group rather than with the records (Kafka Streams
splits them the same way: StreamThread and TaskManager/TasksRegistry):

- the tasks (active, standby, warm-up copies), their stores, roles and statuses;
- the group's last assignment (who hosts what, for routing) and the rebalance state;
- what this instance reports when it joins (its lags, from local checkpoints too);
- the progress watchdog's view of each task;
- the one read interface queries use: "may I serve this partition, and how fresh is it"
  (`access`). Routes, projections and snapshots ask it; none reads the runner's fields.

No Kafka client is touched here: transitions (`suspend`, `assign`) change the bookkeeping and
say what the loop must do with its clients (close a producer, pause an input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from enhydra.assignment.protocol import GroupMap, MemberAssignment, MemberReport
from enhydra.runner.tasks import Role, Task, TaskStatus
from enhydra.runner.watchdog import Stuck, Watchdog
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

# (partition, checkpoint) -> changelog records behind, or None when the end is not known yet
ChangelogLag = Callable[[int, int], int | None]


class Verdict(StrEnum):
    SERVE = "serve"  # the running active copy, outside a rebalance: the current truth
    STALE = "stale"  # a copy that may be behind (asked for with allow_stale), with its lag
    UNAVAILABLE = "unavailable"  # held here but restoring, or a rebalance/stop is under way
    NOT_HOSTED = "not_hosted"  # another instance holds the partition


@dataclass(frozen=True, slots=True)
class ReadAccess:
    """The answer to "may I serve this partition": the store to read, or why not."""

    verdict: Verdict
    partition: int
    store: PartitionStore | None = None
    lag: int = 0  # changelog records the copy is behind (0 when serving)
    settled: bool = True  # in the group, not rebalancing, not stopping
    reason: str = ""

    @property
    def readable(self) -> bool:
        return self.verdict in (Verdict.SERVE, Verdict.STALE)


@dataclass(frozen=True, slots=True)
class Assigned:
    """What the loop must do with its clients after an assignment was recorded."""

    closed_active: list[int]  # tasks that stop being active here: close their producers
    active: list[int]  # the active tasks now: open their producers, pause their inputs


class TaskRegistry:
    def __init__(
        self,
        settings: Settings,
        store_root: Path,
        *,
        new_cache: Callable[[], Any],
        changelog_lag: ChangelogLag,
        watchdog_s: float,
    ) -> None:
        self.settings = settings
        self.store_root = store_root
        self._new_cache = new_cache
        self._changelog_lag = changelog_lag
        self.tasks: dict[int, Task] = {}
        self.group = GroupMap()
        self.assignment = MemberAssignment()  # this instance's part of the last assignment
        self.joined = False
        self.rebalancing = False
        self.rebalances = 0
        self.stopping = False
        self.watchdog = Watchdog(watchdog_s)
        self.disk_checkpoints: dict[int, int] = {}  # partition -> changelog offset on disk

    # the one read interface --------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        return self.joined and not self.rebalancing and not self.stopping

    def access(self, partition: int, *, allow_stale: bool = False) -> ReadAccess:
        """May this instance answer for `partition`, from which store, and how fresh."""
        task = self.tasks.get(partition)
        settled = self.settled
        if settled and task is not None and task.serving:
            return ReadAccess(Verdict.SERVE, partition, task.store)
        if allow_stale and task is not None and not self.stopping:
            lag = self.task_lag(task)
            if lag is not None:
                return ReadAccess(Verdict.STALE, partition, task.store, lag, settled)
        if task is not None and task.role is Role.ACTIVE:
            why = "being restored" if task.status is TaskStatus.RESTORING else "rebalanced"
            return ReadAccess(
                Verdict.UNAVAILABLE, partition, settled=settled, reason=f"partition is {why}"
            )
        return ReadAccess(
            Verdict.NOT_HOSTED, partition, settled=settled, reason="hosted by another instance"
        )

    def task_lag(self, task: Task) -> int | None:
        """Changelog records this copy is behind; 0 for a running active (it writes them)."""
        if task.serving:
            return 0
        return self._changelog_lag(task.partition, task.store.changelog_offset)

    @property
    def ready(self) -> bool:
        """In the group, not rebalancing, and every active task restored."""
        return (
            self.joined
            and not self.rebalancing
            and all(t.status is TaskStatus.RUNNING for t in self.active_tasks())
        )

    def active_tasks(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.role is Role.ACTIVE]

    def active_partitions(self) -> list[int]:
        return sorted(p for p, t in self.tasks.items() if t.role is Role.ACTIVE)

    def standby_partitions(self) -> list[int]:
        return sorted(p for p, t in self.tasks.items() if t.role is not Role.ACTIVE)

    def following(self) -> dict[int, Task]:
        """Copies that follow their changelog: standbys and warm-ups."""
        return {p: t for p, t in self.tasks.items() if t.role is not Role.ACTIVE}

    def restoring(self) -> dict[int, Task]:
        return {p: t for p, t in self.tasks.items() if t.role is Role.ACTIVE}

    @property
    def stuck(self) -> dict[int, Stuck]:
        return self.watchdog.stuck

    # the group protocol ------------------------------------------------------------------------
    def scan_local_stores(self) -> None:
        """Checkpoints of store copies left on disk by earlier runs: reported as lags."""
        root = self.store_root
        for path in sorted(root.glob("*")) if root.is_dir() else ():
            if path.name.isdigit() and int(path.name) < self.settings.partitions:
                store = PartitionStore(path)
                self.disk_checkpoints[int(path.name)] = store.changelog_offset
                store.close()

    def report(self) -> MemberReport:
        """What this instance tells the leader when it joins (called inside the join)."""
        lag = self._changelog_lag
        lags: dict[int, int] = {}
        # A task with no local copy lags by its whole changelog: a small one is cheap to
        # restore, so such an instance can count as caught up (acceptable_recovery_lag).
        for partition in range(self.settings.partitions):
            if (value := lag(partition, -1)) is not None:
                lags[partition] = value
        for partition, checkpoint in self.disk_checkpoints.items():
            if (value := lag(partition, checkpoint)) is not None:
                lags[partition] = value
        for partition, task in self.tasks.items():
            running_active = task.role is Role.ACTIVE and task.status is not TaskStatus.RESTORING
            value = 0 if running_active else lag(partition, task.store.changelog_offset)
            if value is not None:
                lags[partition] = value
        s = self.settings
        return MemberReport(
            instance_id=s.instance_id,
            url=s.advertised_url,
            tags=s.client_tags,
            active=frozenset(self.active_partitions()),
            standby=frozenset(self.standby_partitions()),
            lags=lags,
        )

    # transitions -------------------------------------------------------------------------------
    def suspend(self, revoked: set[int]) -> None:
        """A rebalance began: revoked active tasks stop; they may come back without a restore."""
        self.rebalancing = True
        for partition in revoked:
            task = self.tasks.get(partition)
            if task is not None and task.role is Role.ACTIVE:
                task.status = TaskStatus.SUSPENDED

    def leaving_active(self, roles: dict[int, Role]) -> list[int]:
        """Active tasks that the new roles close or demote: their producers must close first."""
        return [
            p
            for p, t in self.tasks.items()
            if t.role is Role.ACTIVE and roles.get(p) is not Role.ACTIVE
        ]

    def assign(self, active: set[int], extra: MemberAssignment) -> Assigned:
        """Record a new assignment: close what left, open what came, set every role."""
        roles: dict[int, Role] = {p: Role.WARMUP for p in extra.warmup}
        roles.update({p: Role.STANDBY for p in extra.standby})
        roles.update({p: Role.ACTIVE for p in active})
        closed_active = self.leaving_active(roles)
        for partition in [p for p in self.tasks if p not in roles]:
            self.close(partition)
        for partition, role in sorted(roles.items()):
            task = self.tasks.get(partition)
            if task is None:
                store = PartitionStore(self.store_root / str(partition))
                task = self.tasks[partition] = Task(partition, store, cache=self._new_cache())
                self.disk_checkpoints.pop(partition, None)
            task.clear_cache()  # the store may have changed while the task was elsewhere
            task.role = role
            task.status = TaskStatus.RESTORING if role is Role.ACTIVE else TaskStatus.RUNNING
        self.watchdog.forget(set(self.tasks))
        self.assignment = extra
        self.group = extra.group
        self.joined = True
        self.rebalancing = False
        self.rebalances += 1
        return Assigned(closed_active, sorted(active))

    def restored(self, task: Task) -> bool:
        """The reader caught an active task up: True when it is still ours to run."""
        if self.tasks.get(task.partition) is not task or task.role is not Role.ACTIVE:
            return False
        task.clear_cache()  # restored: the store is newer than anything cached
        task.status = TaskStatus.RUNNING
        return True

    def close(self, partition: int) -> None:
        task = self.tasks.pop(partition)
        self.disk_checkpoints[partition] = task.store.changelog_offset
        task.store.close()

    def close_all(self) -> None:
        for task in self.tasks.values():
            task.store.close()
        self.tasks.clear()
