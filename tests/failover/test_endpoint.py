"""The heartbeat stream and the probe shell over real sockets, without Kafka."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from enhydra.failover import STREAM_PATH, FailureDetector, Verdict, add_liveness_routes
from enhydra.query.http import build_app
from enhydra.settings import Settings


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


async def serve_api(**env: str) -> tuple[TestClient, str]:
    """The liveness stream as an instance serves it: on the HTTP API's app, with its settings."""
    settings = Settings.from_env({f"ENHYDRA_{k.upper()}": v for k, v in env.items()}, app_id="u")
    app = build_app(lambda: None, "a", "accounts", settings=settings)
    add_liveness_routes(app, "a", interval_s=0.05)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client, str(client.make_url("")).rstrip("/")


async def test_the_stream_needs_the_query_token_like_the_queries_and_peers_send_it():
    client, url = await serve_api(query_token="q-secret", admin_token="adm")
    try:
        assert (await client.get(STREAM_PATH)).status == 401
        wrong = await client.get(STREAM_PATH, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 403 and (await wrong.json())["code"] == "forbidden"
        for token in ("q-secret", "adm"):
            async with client.get(STREAM_PATH, headers={"Authorization": f"Bearer {token}"}) as ok:
                assert ok.status == 200
                assert orjson.loads(await ok.content.readline())["instance"] == "a"

        async def on_dead(instance: str, member: str | None) -> bool:
            return True

        peer = FailureDetector(
            "me", lambda: {"a": url}, on_dead, headers={"Authorization": "Bearer q-secret"}
        )
        await peer.start()
        try:
            for _ in range(100):
                if "a" in peer.peers and peer.peers["a"].decision.verdict is Verdict.ALIVE:
                    break
                await asyncio.sleep(0.02)
            assert peer.peers["a"].decision.verdict is Verdict.ALIVE
        finally:
            await peer.stop()
    finally:
        await client.close()


async def test_open_streams_are_capped_and_the_one_over_is_told_why():
    client, _ = await serve_api(liveness_max_streams="2")
    try:
        first = await client.get(STREAM_PATH)
        second = await client.get(STREAM_PATH)
        assert first.status == second.status == 200
        over = await client.get(STREAM_PATH)
        body = await over.json()
        assert over.status == 503 and body["code"] == "too_many_streams"
        assert "at most 2 liveness streams" in body["error"]
        first.close()
        for _ in range(100):  # the server notices the close at its next line
            again = await client.get(STREAM_PATH)
            if again.status == 200:
                again.close()
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a closed stream did not free its place")
        second.close()
    finally:
        await client.close()
