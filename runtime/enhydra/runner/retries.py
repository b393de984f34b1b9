"""Bookkeeping for records that failed with a transient error and are being retried.

A record is retried with exponential backoff until task_timeout has passed since its first
failure; then the processing error policy (DLQ or FAIL) takes it, with the attempts counted.
"""

from __future__ import annotations

import time

MAX_BACKOFF_S = 5.0


class RetryTracker:
    def __init__(self, backoff_s: float, timeout_s: float) -> None:
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._state: dict[tuple[int, int], tuple[float, int]] = {}

    def record(self, partition: int, offset: int, now: float | None = None) -> tuple[int, float]:
        """Note one more failed attempt; returns (attempts so far, backoff before the next)."""
        now = time.monotonic() if now is None else now
        first, attempts = self._state.get((partition, offset), (now, 0))
        attempts += 1
        self._state[(partition, offset)] = (first, attempts)
        return attempts, min(self.backoff_s * 2 ** (attempts - 1), MAX_BACKOFF_S)

    def give_up(self, partition: int, now: float | None = None) -> dict[int, int]:
        """Offsets of this partition whose retries have used up task_timeout -> attempts."""
        now = time.monotonic() if now is None else now
        return {
            offset: attempts
            for (p, offset), (first, attempts) in self._state.items()
            if p == partition and now - first >= self.timeout_s
        }

    def forget(self, partition: int, offset: int) -> None:
        self._state.pop((partition, offset), None)

    def forget_through(self, partition: int, offset: int) -> None:
        """Records up to `offset` were handled (applied, or failed for good): stop tracking them."""
        if self._state:
            for key in [k for k in self._state if k[0] == partition and k[1] <= offset]:
                del self._state[key]

    def retrying(self, partition: int) -> bool:
        """A record of `partition` waits out a transient error's backoff."""
        return any(p == partition for p, _ in self._state)
