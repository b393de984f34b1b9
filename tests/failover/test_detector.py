"""The failure detector against real processes on the real broker.

Two static members (s1, v1) with a 30 s session timeout, both serving the liveness stream and
sending beacons; the detector runs here, reads the beacons from the control topic, probes both,
and removes a dead member with LeaveGroup by instance id.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from enhydra.control.channel import ControlChannel
from enhydra.failover import DetectorConfig, FailureDetector, Verdict, group_remover
from enhydra.kafka.clients import as_connection
from tests.failover.support import PeerProcess, make_group_topics, stalled_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

PARTITIONS = 4
SESSION_MS = 30_000
CONFIG = DetectorConfig()  # the defaults: suspect after 1 s, dead after 5 s of silence on both


@dataclass
class Cluster:
    bootstrap: str
    group: str
    survivor: PeerProcess
    victim: PeerProcess
    detector: FailureDetector
    verdicts: list[tuple[float, str, Verdict]]

    def verdicts_of(self, instance: str) -> set[Verdict]:
        return {v for _, name, v in self.verdicts if name == instance}


async def until(check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout} s")


@pytest.fixture
async def cluster(kafka_bootstrap) -> AsyncIterator[Cluster]:
    group = f"fd-{uuid.uuid4().hex[:8]}"
    await make_group_topics(kafka_bootstrap, group, f"{group}-in", PARTITIONS)
    options = {
        "bootstrap": kafka_bootstrap,
        "group": group,
        "topic": f"{group}-in",
        "session_timeout_ms": SESSION_MS,
        "heartbeat_interval_ms": 500,
        "beacon": True,
    }
    survivor = PeerProcess("s1", **options)
    victim = PeerProcess("v1", **options)
    peers = {"s1": survivor.url, "v1": victim.url}
    verdicts: list[tuple[float, str, Verdict]] = []
    detector = FailureDetector("observer", lambda: peers, group_remover(kafka_bootstrap, group))

    control = ControlChannel(
        as_connection(kafka_bootstrap), group, "observer", detector.on_control_message
    )
    await control.start()
    await detector.start()

    async def record() -> None:
        while True:
            for name, peer in list(detector.peers.items()):
                verdicts.append((time.monotonic(), name, peer.decision.verdict))
            await asyncio.sleep(0.05)

    recorder = asyncio.create_task(record())
    c = Cluster(kafka_bootstrap, group, survivor, victim, detector, verdicts)
    try:
        await until(lambda: all_assigned(c), 60)
        await until(lambda: alive(c, "s1") and alive(c, "v1"), 30)
        await asyncio.sleep(1)  # settled: count rebalances from here
        yield c
    finally:
        recorder.cancel()
        await detector.stop()
        await control.stop()
        survivor.close()
        victim.close()


def all_assigned(c: Cluster) -> bool:
    a, b = c.survivor.assignment(), c.victim.assignment()
    return bool(a) and bool(b) and sorted(a + b) == list(range(PARTITIONS))


def alive(c: Cluster, name: str) -> bool:
    peer = c.detector.peers.get(name)
    return peer is not None and peer.decision.verdict is Verdict.ALIVE


def removed(c: Cluster, name: str) -> list[float]:
    return [at for instance, at in c.detector.removed if instance == name]


def rebalances_seen_by(peer: PeerProcess, since: int) -> list[dict]:
    return [e for e in peer.events[since:] if e["event"] in ("assigned", "revoked")]


async def test_kill_9_is_detected_and_removed_in_about_a_second(cluster: Cluster):
    c = cluster
    killed = time.monotonic()
    c.victim.kill()
    await until(lambda: removed(c, "v1"), SESSION_MS / 3000)
    detected = removed(c, "v1")[0] - killed
    await until(lambda: c.survivor.assignment() == list(range(PARTITIONS)), SESSION_MS / 3000)
    handed = time.monotonic() - killed
    print(f"kill -9 -> removed {detected:.2f} s, partitions on the survivor {handed:.2f} s")
    assert removed(c, "s1") == []
    assert handed < SESSION_MS / 3000  # far below the 30 s session timeout


async def test_a_paused_process_is_removed_after_the_window_and_rejoins_when_resumed(
    cluster: Cluster,
):
    c = cluster
    first_member = next(e["member"] for e in c.victim.events if e["event"] == "assigned")
    stopped = time.monotonic()
    c.victim.signal(signal.SIGSTOP)
    await until(lambda: removed(c, "v1"), CONFIG.probe_window_s + 10)
    took = removed(c, "v1")[0] - stopped
    print(f"SIGSTOP -> removed after {took:.2f} s (window {CONFIG.probe_window_s} s)")
    assert took >= CONFIG.probe_window_s - 1.0  # the beacon may be up to 1 s older than the stop
    await until(lambda: c.survivor.assignment() == list(range(PARTITIONS)), 15)

    c.victim.signal(signal.SIGCONT)
    back = c.victim.wait_for(
        lambda e: e["event"] == "assigned" and e["member"] != first_member and e["partitions"], 30
    )
    assert back["partitions"]
    await until(lambda: alive(c, "v1"), 10)
    await until(lambda: all_assigned(c), 15)
    assert removed(c, "v1") == [removed(c, "v1")[0]]  # once


async def test_a_stalled_http_port_of_a_consuming_process_is_not_removed(cluster: Cluster):
    c = cluster
    seen_s, seen_v = len(c.survivor.events), len(c.victim.events)
    assert c.victim.port is not None
    stall = 2 * CONFIG.probe_window_s + 2
    start = len(c.verdicts)
    with stalled_port(c.victim.port):
        await asyncio.sleep(stall)
        during = {v for _, name, v in c.verdicts[start:] if name == "v1"}
    assert Verdict.SUSPECT in during, "the stall was not noticed at all"
    assert Verdict.DEAD not in during
    assert removed(c, "v1") == []
    assert rebalances_seen_by(c.survivor, seen_s) == []
    assert rebalances_seen_by(c.victim, seen_v) == []
    await until(lambda: alive(c, "v1"), 10)


async def test_a_rolling_restart_is_not_removed_and_causes_no_rebalance(cluster: Cluster):
    c = cluster
    seen = len(c.survivor.events)
    before = c.victim.assignment()
    restarted = len(c.victim.events)
    # SIGTERM: goodbye on the stream, no LeaveGroup. Waited for in a thread: the detector runs
    # on this loop and must see the goodbye and the way back (blocked, it once ran 30 s late).
    await asyncio.to_thread(c.victim.terminate)
    await asyncio.sleep(2)  # down for a while: refused connects the whole time
    await asyncio.to_thread(c.victim.start)
    back = await asyncio.to_thread(
        c.victim.wait_for, lambda e: e["event"] == "assigned", 30, restarted
    )
    assert back["partitions"] == before
    await until(lambda: alive(c, "v1"), 10)
    assert removed(c, "v1") == []
    assert rebalances_seen_by(c.survivor, seen) == []


async def test_a_blocked_event_loop_shorter_than_the_window_is_not_removed(cluster: Cluster):
    c = cluster
    seen = len(c.survivor.events)
    start = len(c.verdicts)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{c.victim.url}/block?seconds=3") as response,
    ):
        assert response.status == 200
    await until(lambda: alive(c, "v1"), 10)
    during = {v for _, name, v in c.verdicts[start:] if name == "v1"}
    assert Verdict.SUSPECT in during and Verdict.DEAD not in during
    assert removed(c, "v1") == []
    assert rebalances_seen_by(c.survivor, seen) == []
