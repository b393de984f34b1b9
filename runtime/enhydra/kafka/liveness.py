"""How recently the group coordinator confirmed this consumer's membership, and its generation.

A member cut off from the brokers keeps its tasks in its own eyes until its next rebalance,
while the group gives them to another member one session timeout after the last heartbeat the
coordinator received. Under at-least-once nothing else fences it, so before it writes a
changelog record it asks how old that confirmation is. aiokafka keeps the time of the last
successful heartbeat in a local variable of its heartbeat loop: the coordinator's heartbeat
call is wrapped here (the only module that does) to note when each successful one was sent,
which is no later than the coordinator received it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

NO_GENERATION = -1  # aiokafka's generation before the first join


class GroupLiveness:
    """The membership of one group consumer, seen from inside (a consumer made elsewhere)."""

    def __init__(self, consumer: Callable[[], Any]) -> None:
        self._consumer = consumer  # the consumer may be built after this object
        self._watched: Any = None  # the coordinator whose heartbeats are timed
        self.confirmed = float("-inf")  # monotonic time the membership was last known good
        self._news = asyncio.Event()

    def assigned(self) -> None:
        """The group just gave this member its tasks: the membership is confirmed now."""
        self._watch()
        self._confirm(time.monotonic())

    def generation(self) -> int:
        """The group generation this member joined last (NO_GENERATION before a join)."""
        coordinator = getattr(self._consumer(), "_coordinator", None)
        generation = getattr(coordinator, "generation", NO_GENERATION)
        return generation if isinstance(generation, int) else NO_GENERATION

    def age(self) -> float:
        """Seconds since the membership was last confirmed."""
        return time.monotonic() - self.confirmed

    async def confirmed_within(self, max_age_s: float, wait_s: float) -> bool:
        """Whether the membership was confirmed less than `max_age_s` ago, waiting up to
        `wait_s` for a heartbeat to confirm it."""
        deadline = time.monotonic() + wait_s
        while self.age() >= max_age_s:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._news.clear()
            try:
                await asyncio.wait_for(self._news.wait(), left)
            except TimeoutError:
                return self.age() < max_age_s
        return True

    def _confirm(self, at: float) -> None:
        self.confirmed = max(self.confirmed, at)
        self._news.set()

    def _watch(self) -> None:
        coordinator = getattr(self._consumer(), "_coordinator", None)
        if coordinator is None or coordinator is self._watched:
            return
        self._watched = coordinator
        heartbeat = coordinator._do_heartbeat

        async def timed_heartbeat() -> bool:
            sent = time.monotonic()
            ok = await heartbeat()
            if ok:
                self._confirm(sent)
            return ok

        coordinator._do_heartbeat = timed_heartbeat
