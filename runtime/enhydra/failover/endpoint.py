"""The instance side of liveness probing: a heartbeat stream peers keep open.

`GET /v1/liveness/stream` answers with one JSON line at once, then one every `interval_s`
for as long as the peer keeps the connection. The lines are written by this process's event
loop, so they stop when the process is paused or its loop is blocked, and the connection closes
the moment the process dies (the kernel closes its sockets). Each line carries this instance's
id (so a peer that reaches someone else at a reused address notices), its current Kafka member
id (so a removal names exactly this incarnation), and how late the loop woke up for it.

On a clean stop (the aiohttp app shutting down, or `goodbye()` called earlier) every stream
gets a last line `{"bye": ...}` before it closes: a peer that reads it does not take the close
for a death. A line is ~100 bytes, so a peer costs about 0.5 kB/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import orjson
from aiohttp import web

STREAM_PATH = "/v1/liveness/stream"
DEFAULT_INTERVAL_S = 0.2
SLOW_AFTER_S = 0.1  # a tick this late says "my loop runs late" (still alive)


class LivenessEndpoint:
    """Serves the heartbeat streams of one instance."""

    def __init__(
        self,
        instance_id: str,
        *,
        member_id: Callable[[], str | None] = lambda: None,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"liveness interval must be above 0 s, got {interval_s}")
        self.instance_id = instance_id
        self.interval_s = interval_s
        self._member_id = member_id
        self._bye: str | None = None
        self._stopping = asyncio.Event()
        self.streams = 0  # open streams, for /v1/stats

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(STREAM_PATH, self.stream)
        app.on_shutdown.append(self._on_shutdown)

    async def goodbye(self, reason: str = "restart") -> None:
        """Tell every peer this is a clean stop, then end the streams (idempotent)."""
        if self._bye is None:
            self._bye = reason
        self._stopping.set()
        await asyncio.sleep(0)  # let the stream handlers write their last line

    async def _on_shutdown(self, _app: web.Application) -> None:
        await self.goodbye("stop")

    def _line(self, seq: int, lag_s: float) -> bytes:
        line = {
            "instance": self.instance_id,
            "member": self._member_id(),
            "seq": seq,
            "lag_ms": round(lag_s * 1000, 1),
            "slow": lag_s >= SLOW_AFTER_S,
        }
        return orjson.dumps(line) + b"\n"

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"}
        )
        self.streams += 1
        seq = 0
        try:
            await response.prepare(request)
            await response.write(self._line(seq, 0.0))
            while not self._stopping.is_set():
                due = time.monotonic() + self.interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.interval_s)
                if self._stopping.is_set():
                    break
                seq += 1
                await response.write(self._line(seq, max(0.0, time.monotonic() - due)))
            bye = {"instance": self.instance_id, "bye": self._bye or "stop"}
            await response.write(orjson.dumps(bye) + b"\n")
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the peer went away; nothing to tell it
        finally:
            self.streams -= 1
        return response


def add_liveness_routes(
    app: web.Application,
    instance_id: str,
    *,
    member_id: Callable[[], str | None] = lambda: None,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> LivenessEndpoint:
    """Add the heartbeat stream to `app`; keep the endpoint to call `goodbye()` early if needed."""
    endpoint = LivenessEndpoint(instance_id, member_id=member_id, interval_s=interval_s)
    endpoint.add_routes(app)
    return endpoint
