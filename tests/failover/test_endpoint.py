"""The heartbeat stream and the probe shell over real sockets, without Kafka."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import orjson
from aiohttp import web

from enhydra.failover import STREAM_PATH, FailureDetector, Verdict, add_liveness_routes


async def serve(instance: str, member: str = "m-1") -> tuple[web.AppRunner, str]:
    app = web.Application()
    add_liveness_routes(app, instance, member_id=lambda: member, interval_s=0.05)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_the_stream_says_who_and_how_late_and_says_goodbye_on_shutdown():
    runner, url = await serve("a", member="member-7")
    lines = []
    async with aiohttp.ClientSession() as session, session.get(url + STREAM_PATH) as response:
        assert response.headers["Content-Type"] == "application/x-ndjson"
        async for raw in response.content:
            lines.append(orjson.loads(raw))
            if len(lines) == 3:
                time.sleep(0.3)  # this loop (the server's too) stands still: the next is late
            if len(lines) == 6:
                asyncio.get_running_loop().create_task(runner.cleanup())
    assert {line["instance"] for line in lines} == {"a"}
    beats = [line for line in lines if "seq" in line]
    assert [b["seq"] for b in beats] == list(range(len(beats)))
    assert all(b["member"] == "member-7" for b in beats)
    assert any(b["slow"] and b["lag_ms"] >= 100 for b in beats)
    assert lines[-1] == {"instance": "a", "bye": "stop"}


async def test_a_clean_shutdown_is_not_taken_for_a_death():
    runner, url = await serve("a")
    calls: list[str] = []

    async def on_dead(instance: str, member: str | None) -> bool:
        calls.append(instance)
        return True

    detector = FailureDetector("me", lambda: {"a": url}, on_dead)
    await detector.start()
    try:
        while (
            "a" not in detector.peers or detector.peers["a"].decision.verdict is not Verdict.ALIVE
        ):
            await asyncio.sleep(0.02)
        await runner.cleanup()  # the port closes: refused from now on
        verdicts = set()
        for _ in range(75):  # 1.5 s
            verdicts.add(detector.peers["a"].decision.verdict)
            await asyncio.sleep(0.02)
        assert Verdict.DEAD not in verdicts and calls == []
        assert "stopped cleanly" in detector.peers["a"].decision.reason, detector.peers["a"].state
    finally:
        await detector.stop()
