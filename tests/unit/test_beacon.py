"""The liveness beacon's own loop: what it says when a send is slow or fails."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from enhydra.failover.beacon import Beacon


async def run_beacon(outcomes: list[str], interval_s: float = 0.02) -> tuple[Beacon, list[dict]]:
    """Each send in turn: "ok", "slow" (outlasts the interval) or "error"; then "ok" forever."""
    sends = iter(outcomes)

    async def send(kind: str, **fields) -> None:
        outcome = next(sends, "ok")
        if outcome == "slow":
            await asyncio.sleep(interval_s * 5)
        elif outcome == "error":
            raise ConnectionError("broker unreachable")

    beacon = Beacon(send, interval_s=interval_s)
    with capture_logs() as logged:
        beacon.start()
        while beacon.sent < 3:
            await asyncio.sleep(interval_s)
        await beacon.stop()
    return beacon, [e for e in logged if e["event"] == "liveness beacon not sent"]


async def test_one_slow_send_at_start_is_not_reported() -> None:
    _, warnings = await run_beacon(["slow", "ok"])
    assert warnings == []


async def test_sends_failing_in_a_row_are_reported_once_with_their_count() -> None:
    _, warnings = await run_beacon(["error", "slow", "error", "error"])
    assert [w["failed_in_a_row"] for w in warnings] == [2]
    assert "TimeoutError" in warnings[0]["error"]
