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

A stream is held open for as long as the client likes, so it is guarded like the API's queries
(the HTTP API that hosts the route sets a `StreamPolicy` on the app: its token check, the cap on
open streams); peers share the settings, so they send the token. Over the cap: 503 with why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

STREAM_PATH = "/v1/liveness/stream"
DEFAULT_INTERVAL_S = 0.2
SLOW_AFTER_S = 0.1  # a tick this late says "my loop runs late" (still alive)
DEFAULT_MAX_STREAMS = 128  # one per peer; a group of 100 instances fits


def _no_check(_request: web.Request) -> web.Response | None:
    return None


@dataclass(frozen=True)
class StreamPolicy:
    """Who may open a stream (`refuse` answers a refusal, or None) and how many may be open."""

    refuse: Callable[[web.Request], web.Response | None] = _no_check
    max_streams: int = DEFAULT_MAX_STREAMS

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(
                f"liveness streams: the cap must be at least 1, got {self.max_streams}"
            )


STREAM_POLICY = web.AppKey("enhydra.liveness.policy", StreamPolicy)


class LivenessEndpoint:
    """Serves the heartbeat streams of one instance."""

    def __init__(
        self,
        instance_id: str,
        *,
        member_id: Callable[[], str | None] = lambda: None,
        interval_s: float = DEFAULT_INTERVAL_S,
        policy: StreamPolicy | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"liveness interval must be above 0 s, got {interval_s}")
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.policy = policy  # None: the app's (STREAM_POLICY), else open with the default cap
        self._member_id = member_id
        self._bye: str | None = None
        self._stopping = asyncio.Event()
        self.streams = 0  # open streams, for /v1/stats

    def add_routes(self, app: web.Application) -> None:
        if self.policy is None:
            self.policy = app.get(STREAM_POLICY, StreamPolicy())
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
        policy = self.policy or StreamPolicy()
        refusal = policy.refuse(request)
        if refusal is not None:
            return refusal
        if self.streams >= policy.max_streams:
            reason = (
                f"this instance serves at most {policy.max_streams} liveness streams at once "
                "(ENHYDRA_LIVENESS_MAX_STREAMS); one per peer is enough"
            )
            body = {"error": reason, "code": "too_many_streams"}
            return web.Response(
                body=orjson.dumps(body),
                status=503,
                content_type="application/json",
                headers={"Retry-After": "1"},
            )
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
    policy: StreamPolicy | None = None,
) -> LivenessEndpoint:
    """Add the heartbeat stream to `app`; keep the endpoint to call `goodbye()` early if needed.

    Without a `policy`, the app's (set by query.http.build_app from the settings) applies.
    """
    endpoint = LivenessEndpoint(
        instance_id, member_id=member_id, interval_s=interval_s, policy=policy
    )
    endpoint.add_routes(app)
    return endpoint
