"""How many dead letters the DLQ topic holds, asked of the broker, not counted by this process.

A counter of this instance's failures starts at 0 with every start; the topic's end minus start
offsets, per partition, is what the DLQ holds whoever wrote it and whenever. Under
exactly_once the end also counts the transactions' commit markers, so the number is an upper
bound there (`exact` says which). One consumer per instance asks, at most every `max_age_s`:
the status page refreshes every 2 s on every open tab and every peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from enhydra.kafka.clients import Consumer, close, new_consumer, start
from enhydra.kafka.reading import TopicMissing, offsets
from enhydra.logs import get_logger
from enhydra.settings import Connection

log = get_logger("enhydra.http")


def count(begins: dict[int, int], ends: dict[int, int]) -> int:
    """Records between each partition's start and end offsets."""
    return sum(max(0, end - begins.get(p, 0)) for p, end in ends.items())


class DeadLetterCount:
    """The DLQ topic's size, read from its offsets and kept for `max_age_s`."""

    def __init__(
        self,
        conn: Connection,
        topic: str,
        *,
        exact: bool = True,
        max_age_s: float = 5.0,
        timeout_s: float = 5.0,
        wait_s: float = 1.0,
    ) -> None:
        self.conn, self.topic, self.exact = conn, topic, exact
        self.max_age_s, self.timeout_s, self.wait_s = max_age_s, timeout_s, wait_s
        self._consumer: Consumer | None = None
        self._answer: dict[str, Any] | None = None
        self._asked = 0.0
        self._asking: asyncio.Task[None] | None = None

    async def get(self) -> dict[str, Any]:
        """{"topic", "records", "exact"}; records is None with an "error" when not known yet.

        A fresh answer is returned at once; a stale one too, while a new one is asked for in
        the background; the first waits at most `wait_s`, so a slow broker never holds a page
        (or a peer's /v1/stats, which /v1/metadata awaits briefly) for long.
        """
        if self._asking is None and (
            self._answer is None or time.monotonic() - self._asked >= self.max_age_s
        ):
            self._asking = asyncio.ensure_future(self._refresh())
        if self._answer is None and self._asking is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._asking), self.wait_s)
        if self._answer is None:
            return {**self._unknown(), "error": "asking the broker"}
        return dict(self._answer)

    async def _refresh(self) -> None:
        try:
            self._answer = await self._ask()
            self._asked = time.monotonic()
        finally:
            self._asking = None

    def _unknown(self) -> dict[str, Any]:
        return {"topic": self.topic, "records": None, "exact": self.exact}

    async def _ask(self) -> dict[str, Any]:
        answer = self._unknown()
        try:
            if self._consumer is None:
                consumer = new_consumer(self.conn)
                await start(consumer, self.conn, doing="count the DLQ", timeout=self.timeout_s)
                self._consumer = consumer
            begins, ends = await asyncio.wait_for(
                offsets(self._consumer, self.topic), self.timeout_s
            )
        except TopicMissing:
            answer["records"] = 0  # nothing was ever dead-lettered
        except Exception as exc:  # an answer to a page, not a failure of the instance
            log.debug("DLQ count unknown", topic=self.topic, error=repr(exc))
            answer["error"] = f"cannot read the DLQ's offsets now: {type(exc).__name__}"
            await self.close()
        else:
            answer["records"] = count(begins, ends)
        return answer

    async def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
            with contextlib.suppress(BaseException):
                await self._asking
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await close(consumer)
