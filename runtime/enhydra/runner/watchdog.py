"""The progress watchdog: a task with work waiting that does not move is stuck, and says so.

Pure: the runner reports, about once a second, each task's position (the input offset it has
processed, or the changelog offset it has restored) and how much is waiting behind it; the
watchdog answers which tasks have had work waiting and made no progress for `limit_s`. A stuck
task fails the liveness probe (the orchestrator restarts the process), is logged once per
episode and is counted in /metrics: never silently stuck while reporting healthy.

Held on purpose is not stuck: a partition stopped at a snapshot cut, or one whose input waits
out a transient error's backoff, is reported `held` and its clock restarts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stuck:
    """One task that has had work waiting and made no progress."""

    partition: int
    phase: str  # "processing" (input waits) or "restoring" (changelog waits)
    position: int  # where it stands still
    waiting: int  # records behind it
    seconds: float  # since its last progress

    def reason(self) -> str:
        return (
            f"partition {self.partition} made no {self.phase} progress for "
            f"{self.seconds:.0f}s at offset {self.position} with {self.waiting} records waiting"
        )


@dataclass(slots=True)
class _Track:
    phase: str
    position: int
    waiting: int
    since: float  # last progress (or last time nothing waited)


class Watchdog:
    def __init__(self, limit_s: float) -> None:
        if limit_s <= 0:
            raise ValueError("the watchdog's limit must be positive")
        self.limit_s = limit_s
        self.trips = 0  # episodes of a task becoming stuck, for /metrics
        self._tracks: dict[int, _Track] = {}
        self._stuck: dict[int, Stuck] = {}

    def observe(
        self,
        partition: int,
        now: float,
        *,
        phase: str,
        position: int,
        waiting: int | None,
        held: bool = False,
    ) -> Stuck | None:
        """Note where a task stands; returns a Stuck when it has just become stuck.

        `waiting` None means unknown (no fetch answered yet): not evidence of being stuck.
        """
        track = self._tracks.get(partition)
        moved = track is None or track.phase != phase or track.position != position
        if moved or held or not waiting:
            self._tracks[partition] = _Track(phase, position, waiting or 0, now)
            self._stuck.pop(partition, None)
            return None
        track.waiting = waiting
        if now - track.since < self.limit_s:
            return None
        stuck = Stuck(partition, phase, position, waiting, now - track.since)
        first = partition not in self._stuck
        self._stuck[partition] = stuck
        if first:
            self.trips += 1
            return stuck
        return None

    def forget(self, keep: set[int]) -> None:
        """Tasks no longer held here (revoked, closed) are not watched any more."""
        for partition in [p for p in self._tracks if p not in keep]:
            del self._tracks[partition]
            self._stuck.pop(partition, None)

    @property
    def stuck(self) -> dict[int, Stuck]:
        """The tasks stuck now, by partition."""
        return dict(self._stuck)
