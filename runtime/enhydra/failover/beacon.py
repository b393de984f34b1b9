"""The second liveness channel: a small message through Kafka five times a second.

A peer whose HTTP port cannot be reached but whose beacon keeps arriving is running and
reaching Kafka (so it is consuming): the detector must not remove it. The beacon is sent with
the control channel's `send(kind, **fields)` and read where control messages are read, so it
needs no client of its own. It is frequent because a refused connect counts as a death only
once the beacon has gone quiet too (detector.py, rule 2): ~100 bytes, 5 a second per instance.
It is signed like every control message (control/signing.py): a beacon forged or copied by
another writer is refused before it reaches the detector, so it cannot keep a dead peer
looking alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from enhydra.failover.detector import BEACON_INTERVAL_S
from enhydra.logs import get_logger

log = get_logger("enhydra.failover")

BEACON = "liveness"
REPORT_EVERY_S = 60.0
DEFAULT_BEACON_INTERVAL_S = BEACON_INTERVAL_S


def beacon_origin(message: Mapping[str, Any]) -> str | None:
    """The instance a control message is a beacon of, or None if it is something else."""
    if message.get("type") != BEACON:
        return None
    origin = message.get("origin")
    return origin if isinstance(origin, str) and origin else None


class Beacon:
    """Sends this instance's beacon every `interval_s` until stopped."""

    def __init__(
        self,
        send: Callable[..., Awaitable[Any]],
        *,
        member_id: Callable[[], str | None] = lambda: None,
        interval_s: float = DEFAULT_BEACON_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"beacon interval must be above 0 s, got {interval_s}")
        self._send = send
        self._member_id = member_id
        self.interval_s = interval_s
        self.sent = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="enhydra-liveness-beacon")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        failed, last_report = 0, -REPORT_EVERY_S
        while True:
            try:
                await asyncio.wait_for(
                    self._send(BEACON, seq=self.sent, member=self._member_id()), self.interval_s
                )
                self.sent += 1
                failed = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Kafka unreachable: peers see our beacon stop, as they should
                failed += 1
                now = time.monotonic()
                # One slow send is not news (the first write to a just-created replicated topic
                # takes longer than an interval); two in a row, and then once a minute, are.
                if failed >= 2 and now - last_report >= REPORT_EVERY_S:
                    last_report = now
                    log.warning(
                        "liveness beacon not sent",
                        error=f"{type(exc).__name__}: {exc}",
                        failed_in_a_row=failed,
                    )
            await asyncio.sleep(self.interval_s)
