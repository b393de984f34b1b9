"""What to do when the processing worker dies: replace it (within a budget), or stop.

REPLACE_WORKER starts a fresh engine in the same process (it rejoins the group and restores
from its local checkpoints, so a replacement costs seconds); after `max_replacements` within
`window_s` it escalates, because a worker that keeps dying needs a human, not a loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from enhydra.errors.policies import UncaughtPolicy

EXIT_SHUTDOWN_CLIENT = 1
EXIT_SHUTDOWN_APPLICATION = 2
# Could not start: a bad setting, or Kafka unreachable, refusing the credentials or the access.
EXIT_CANNOT_START = 3


@dataclass
class RestartBudget:
    """At most `max_restarts` within any `window_s` seconds."""

    max_restarts: int
    window_s: float
    _times: deque[float] = field(default_factory=deque)

    def take(self, now: float) -> bool:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True

    @property
    def used(self) -> int:
        return len(self._times)


UncaughtHandler = UncaughtPolicy | str | Callable[[BaseException], UncaughtPolicy | str]


@dataclass
class UncaughtDecider:
    handler: UncaughtHandler
    budget: RestartBudget
    escalation: UncaughtPolicy = UncaughtPolicy.SHUTDOWN_CLIENT

    def decide(self, error: BaseException, now: float | None = None) -> UncaughtPolicy:
        choice = self.handler(error) if callable(self.handler) else self.handler
        try:
            policy = UncaughtPolicy(str(choice).lower())
        except ValueError:
            allowed = ", ".join(p.upper() for p in UncaughtPolicy)
            message = f"uncaught error handler returned {choice!r}; allowed: {allowed}"
            raise ValueError(message) from None
        if policy is UncaughtPolicy.REPLACE_WORKER and not self.budget.take(
            time.monotonic() if now is None else now
        ):
            return self.escalation
        return policy
