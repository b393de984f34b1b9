"""Static membership with fast removal vs the session timeout: kill -9 and restarts, one run.

    .venv/bin/python bench/static_membership.py               # 3 interleaved repeats
    .venv/bin/python bench/static_membership.py --repeat 1 --skip-static-alone

Two plain aiokafka consumer processes (tests/failover/peer.py: a consumer that reports its
assignments, serves the liveness stream and sends beacons) share a 4-partition topic on a fresh
local broker. No state, no standby: this measures the group membership alone.

(a) kill -9 of one member: seconds from the kill to the survivor holding all 4 partitions.
    dynamic      no group.instance.id, session 10 s, heartbeat 3 s (today's defaults)
    static       group.instance.id, session 30 s, heartbeat 3 s, nobody removes it
    static+fd    the same, and the failure detector (run here, as a peer would) removes it
                 with LeaveGroup by instance id once its port refuses connections
    static+fd/hb static+fd with a 0.5 s heartbeat: the survivor hears of the rebalance sooner
(b) SIGTERM and restart of one member with the same id: the rebalances (group generations)
    the survivor goes through, and the gap from SIGTERM to the member owning its
    partitions again (process start included).
Variants run interleaved on one broker, so their ratio is measured under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from common import ROOT, fresh_broker, load_average, machine, median, progress, table

sys.path.insert(0, str(ROOT))

from enhydra.control.channel import ControlChannel
from enhydra.failover import FailureDetector, Verdict, group_remover
from enhydra.kafka.clients import as_connection
from tests.failover.support import PeerProcess, make_group_topics

PARTITIONS = 4


@dataclass(frozen=True)
class Variant:
    name: str
    static: bool
    session_ms: int
    heartbeat_ms: int
    detector: bool


KILL_VARIANTS = [
    Variant("dynamic", False, 10_000, 3000, False),
    Variant("static", True, 30_000, 3000, False),
    Variant("static+fd", True, 30_000, 3000, True),
    Variant("static+fd/hb", True, 30_000, 500, True),
]
RESTART_VARIANTS = [
    Variant("dynamic", False, 10_000, 3000, False),
    Variant("static", True, 30_000, 3000, False),
]


async def until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s")
        await asyncio.sleep(0.01)


def holds_all(peer: PeerProcess) -> bool:
    return peer.assignment() == list(range(PARTITIONS))


def split(a: PeerProcess, b: PeerProcess) -> bool:
    x, y = a.assignment(), b.assignment()
    return bool(x) and bool(y) and sorted(x + y) == list(range(PARTITIONS))


async def start_pair(bootstrap: str, v: Variant) -> tuple[str, PeerProcess, PeerProcess]:
    group = f"sm-{v.name.replace('/', '-').replace('+', '-')}-{uuid.uuid4().hex[:6]}"
    await make_group_topics(bootstrap, group, f"{group}-in", PARTITIONS)
    options = {
        "bootstrap": bootstrap,
        "group": group,
        "topic": f"{group}-in",
        "session_timeout_ms": v.session_ms,
        "heartbeat_interval_ms": v.heartbeat_ms,
        "beacon": v.detector,
        "dynamic": not v.static,
    }
    survivor = await asyncio.to_thread(PeerProcess, "s1", **options)
    victim = await asyncio.to_thread(PeerProcess, "v1", **options)
    await until(lambda: split(survivor, victim), 60)
    return group, survivor, victim


async def kill_run(bootstrap: str, v: Variant) -> float:
    group, survivor, victim = await start_pair(bootstrap, v)
    detector = control = None
    try:
        if v.detector:
            peers = {"s1": survivor.url, "v1": victim.url}
            detector = FailureDetector("bench", lambda: peers, group_remover(bootstrap, group))
            control = ControlChannel(
                as_connection(bootstrap), group, "bench", detector.on_control_message
            )
            await control.start()
            await detector.start()
            await until(
                lambda: (
                    all(p.decision.verdict is Verdict.ALIVE for p in detector.peers.values())
                    and len(detector.peers) == 2
                ),
                30,
            )
        await asyncio.sleep(1.0)
        killed = time.monotonic()
        victim.kill()
        await until(lambda: holds_all(survivor), v.session_ms / 1000 + 30)
        event = next(e for e in reversed(survivor.events) if e["event"] == "assigned")
        return event["seen"] - killed
    finally:
        if detector is not None:
            await detector.stop()
        if control is not None:
            await control.stop()
        survivor.close()
        victim.close()


async def restart_run(bootstrap: str, v: Variant) -> tuple[int, float]:
    _group, survivor, victim = await start_pair(bootstrap, v)
    try:
        await asyncio.sleep(1.0 + v.heartbeat_ms / 1000)  # settled
        seen = len(survivor.events)
        restarted = len(victim.events)
        stopped = time.monotonic()
        await asyncio.to_thread(victim.terminate)
        await asyncio.to_thread(victim.start)
        back = await asyncio.to_thread(
            victim.wait_for, lambda e: e["event"] == "assigned" and e["partitions"], 60, restarted
        )
        gap = back["seen"] - stopped
        await until(lambda: split(survivor, victim), 60)
        await asyncio.sleep(2 * v.heartbeat_ms / 1000 + 1)  # a rebalance would show by now
        generations = [e["generation"] for e in survivor.events if e["event"] == "assigned"]
        before = max(e["generation"] for e in survivor.events[:seen] if e["event"] == "assigned")
        return max(generations) - before, gap
    finally:
        survivor.close()
        victim.close()


async def run(args: argparse.Namespace) -> None:
    kills = [v for v in KILL_VARIANTS if not (args.skip_static_alone and v.name == "static")]
    print(f"machine: {machine()}; load average at start {load_average()}")
    kill_results: dict[str, list[float]] = {v.name: [] for v in kills}
    restart_results: dict[str, list[tuple[int, float]]] = {v.name: [] for v in RESTART_VARIANTS}
    with fresh_broker() as (bootstrap, _tmp):
        for round_ in range(args.repeat):
            for v in kills:
                took = await kill_run(bootstrap, v)
                kill_results[v.name].append(took)
                progress(f"round {round_ + 1} kill -9 {v.name}: {took:.2f} s")
            for v in RESTART_VARIANTS:
                rebalances, gap = await restart_run(bootstrap, v)
                restart_results[v.name].append((rebalances, gap))
                progress(
                    f"round {round_ + 1} restart {v.name}: {rebalances} rebalances, {gap:.2f} s"
                )
    print("\n(a) kill -9: seconds until the survivor holds the victim's partitions")
    rows = []
    for v in kills:
        xs = kill_results[v.name]
        rows.append(
            [
                v.name,
                f"{v.session_ms / 1000:g}",
                f"{v.heartbeat_ms / 1000:g}",
                f"{median(xs):.2f}",
                f"{min(xs):.2f}",
                f"{max(xs):.2f}",
            ]
        )
    print(table(["variant", "session s", "heartbeat s", "median s", "min s", "max s"], rows))
    base = median(kill_results["dynamic"])
    for name in ("static+fd", "static+fd/hb"):
        print(f"ratio dynamic/{name}: {base / median(kill_results[name]):.1f}x faster")
    print("\n(b) SIGTERM + restart with the same id: rebalances seen by the survivor, and the gap")
    rows = []
    for v in RESTART_VARIANTS:
        rs = restart_results[v.name]
        rows.append(
            [
                v.name,
                f"{median([r for r, _ in rs]):g}",
                ",".join(str(r) for r, _ in rs),
                f"{median([g for _, g in rs]):.2f}",
            ]
        )
    print(table(["variant", "rebalances (median)", "per run", "gap s (median)"], rows))
    print(f"load average at end {load_average()}; {args.repeat} interleaved repeat(s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--skip-static-alone",
        action="store_true",
        help="skip the variant that waits the whole 30 s session timeout",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
