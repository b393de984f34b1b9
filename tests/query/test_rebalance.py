"""Reads while the group changes: a forced rebalance, an instance shut down over HTTP, its
return. Commands keep flowing meanwhile, so "correct" is checked against the model's history:
every 200 must be a state the account really had, no read may go back in time behind one that
finished before it started, and everything else must be a 503, never an old value as current.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from enhydra.testing.processes import ServiceProcess, produce_json, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import feed
from tests.query.conftest import (
    ADMIN_TOKEN,
    PARTITIONS,
    QUERY_TOKEN,
    TARGET,
    call,
    settled,
    wait_until,
)

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {QUERY_TOKEN}"}


@dataclass
class Read:
    account: str
    instance: str
    started: float
    ended: float
    status: int
    body: Any


def histories(commands: list) -> dict[str, list[dict | None]]:
    """Every state each account goes through (None before it is opened), from the model."""
    per_account: dict[str, list] = defaultdict(list)
    for key, command in commands:
        per_account[key].append((key, command))
    out: dict[str, list[dict | None]] = {}
    for account, mine in per_account.items():
        states: list[dict | None] = [None]
        for i in range(1, len(mine) + 1):
            state = model(mine[:i]).get(account)
            if state != states[-1]:
                states.append(dict(state) if state else None)
        out[account] = states
    return out


def version(read: Read) -> int:
    return read.body["version"] if read.status == 200 else 0


def test_reads_during_rebalances_are_current_values_or_503(
    service_factory, kafka_bootstrap, app_id
):
    def start(name: str, zone: str) -> ServiceProcess:
        env = {
            "ENHYDRA_NUM_STANDBY_REPLICAS": "1",
            "ENHYDRA_CLIENT_TAGS": f"zone={zone}",
            "ENHYDRA_QUERY_TOKEN": QUERY_TOKEN,
            "ENHYDRA_ADMIN_TOKEN": ADMIN_TOKEN,
            "ENHYDRA_PROBING_REBALANCE_INTERVAL_MS": "5000",
        }
        return service_factory(TARGET, name, extra_env=env, partitions=PARTITIONS)

    instances = {name: start(name, zone) for name, zone in (("i1", "a"), ("i2", "b"), ("i3", "c"))}
    for inst in instances.values():
        inst.wait_ready(90)
    commands = generate(200, 5000, seed=83)
    first, later = commands[:2000], commands[2000:]
    feed(kafka_bootstrap, app_id, first)
    wait_until(lambda: settled(list(instances.values())), 90, "the group to settle")
    accounts = sorted({key for key, _ in commands})
    reads: list[Read] = []
    events: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def reader(session: aiohttp.ClientSession, rng: random.Random) -> None:
        while not stop.is_set():
            inst = rng.choice(list(instances.values()))
            account = rng.choice(accounts)
            started = time.monotonic()
            try:
                url = f"{inst.url}/v1/stores/accounts/keys/{account}"
                async with session.get(url, headers=AUTH) as response:
                    status, body = response.status, await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError):
                status, body = 0, None
            reads.append(Read(account, inst.instance_id, started, time.monotonic(), status, body))
            if status in (0, 503):
                await asyncio.sleep(0.02)

    async def writer() -> None:
        topic = f"{app_id}-commands"
        for i in range(0, len(later), 50):  # about 15 s: through every disruption
            await produce_json(kafka_bootstrap, topic, later[i : i + 50])
            await asyncio.sleep(0.2)
        events.append((time.monotonic(), "all commands sent"))

    async def wait_for(predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(predicate):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.5)
        events.append((time.monotonic(), what))

    def group_of(names: list[str]) -> bool:
        try:
            return settled([instances[n] for n in names], current_standbys=False)
        except OSError:
            return False

    async def disrupt() -> None:
        admin = {"token": ADMIN_TOKEN, "method": "POST"}
        await asyncio.sleep(2)
        answer = await asyncio.to_thread(call, instances["i1"].url + "/v1/admin/rebalance", **admin)
        assert answer.status == 202, answer.body
        events.append((time.monotonic(), "rebalance requested"))
        await asyncio.sleep(4)
        await wait_for(lambda: group_of(["i1", "i2", "i3"]), "settled after the rebalance")
        answer = await asyncio.to_thread(call, instances["i3"].url + "/v1/admin/shutdown", **admin)
        assert answer.status == 202, answer.body
        events.append((time.monotonic(), "i3 shutdown requested"))
        code = await asyncio.to_thread(instances["i3"].process.wait, 60)
        assert code == 0, instances["i3"].log_tail()
        await wait_for(lambda: group_of(["i1", "i2"]), "i1 and i2 own everything")
        instances["i3"] = await asyncio.to_thread(start, "i3", "c")
        await asyncio.to_thread(instances["i3"].wait_ready, 90)
        events.append((time.monotonic(), "i3 back"))
        await asyncio.sleep(3)

    async def run() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            readers = [
                asyncio.create_task(reader(session, random.Random(seed))) for seed in range(6)
            ]
            try:
                await asyncio.gather(writer(), disrupt())
            finally:
                stop.set()
                await asyncio.gather(*readers)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120)

    asyncio.run(run())

    statuses = Counter(r.status for r in reads)
    allowed = histories(commands)
    wrong = []
    for read in reads:
        if read.status == 200:
            if read.body not in allowed[read.account]:
                wrong.append(read)
        elif read.status == 404:
            if read.body.get("code") != "no_such_key" or None not in allowed[read.account]:
                wrong.append(read)
        elif read.status == 0:
            continue  # no answer (the instance that left, or a timeout): never a wrong value
        else:
            assert read.status == 503, (read, read.body)
            assert read.body["code"] in ("unavailable", "starting"), read.body
    assert not wrong, f"{len(wrong)} wrong answers, e.g. {wrong[:3]}"

    # No read may return an older state than a read that had finished before it started.
    went_back = []
    for account in accounts:
        mine = sorted(
            (r for r in reads if r.account == account and r.status in (200, 404)),
            key=lambda r: r.ended,
        )
        by_start = sorted(mine, key=lambda r: r.started)
        newest, i = 0, 0
        for read in by_start:
            while i < len(mine) and mine[i].ended < read.started:
                newest = max(newest, version(mine[i]))
                i += 1
            if version(read) < newest:
                went_back.append((read, newest))
    assert not went_back, f"{len(went_back)} reads went back in time, e.g. {went_back[:3]}"
    assert statuses[200] > 500, statuses

    # Afterwards every instance serves exactly the model's final state.
    wait_until(lambda: settled(list(instances.values())), 90, "the group to settle at the end")
    expected = model(commands)
    for inst in instances.values():
        for account in accounts[::7]:
            answer = call(f"{inst.url}/v1/stores/accounts/keys/{account}")
            want = (200, expected[account]) if account in expected else (404, None)
            assert (answer.status, answer.body if answer.status == 200 else None) == want
    print(f"reads by status: {dict(statuses)}; timeline: {events}")
