"""A task: one partition of a store held by this instance, as an active, standby or warm-up copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from enhydra.stores.partition import PartitionStore


class Role(StrEnum):
    ACTIVE = "active"
    STANDBY = "standby"
    WARMUP = "warmup"


class TaskStatus(StrEnum):
    RESTORING = "restoring"  # active, catching up with its changelog before input flows
    RUNNING = "running"  # active: processing; standby/warm-up: following the changelog
    SUSPENDED = "suspended"  # revoked during a rebalance; may come back without a restore


@dataclass
class Task:
    """One partition held here: the input partition (when active) and the store copy.

    `cache` belongs to the step (decoded entries it keeps); the runner only clears it whenever
    the store may have changed under it.
    """

    partition: int
    store: PartitionStore
    role: Role = Role.ACTIVE
    status: TaskStatus = TaskStatus.RESTORING
    processed: int = 0
    restore: dict[str, float] = field(default_factory=dict)
    cache: Any = None

    @property
    def serving(self) -> bool:
        """An active copy that is processing: its store is the current truth."""
        return self.role is Role.ACTIVE and self.status is TaskStatus.RUNNING

    def clear_cache(self) -> None:
        if self.cache is not None:
            self.cache.clear()
