"""A count over millions of keys must not hold the event loop: processing, the group heartbeat
and the liveness stream run on it, and a frozen loop looks like a dead instance to its peers.

Real RocksDB partitions behind the real route; the engine is reduced to what the route reads.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from enhydra.query.http import build_app
from enhydra.runner.registry import TaskRegistry
from enhydra.runner.tasks import Role, Task, TaskStatus
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

KEYS_PER_PARTITION = 750_000  # 1.5 M keys: about a second of counting on this machine
CHUNK = 50_000


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("count")
    stores = []
    for partition in range(2):
        store = PartitionStore(root / str(partition))
        keys = [b"k-%d-%08d" % (partition, i) for i in range(KEYS_PER_PARTITION)]
        store.ingest_sorted(
            (keys[i : i + CHUNK], [b"v"] * len(keys[i : i + CHUNK]))
            for i in range(0, len(keys), CHUNK)
        )
        stores.append(store)
    settings = Settings.from_env({}, app_id="count", state_dir=root, partitions=2)
    registry = TaskRegistry(
        settings, root, new_cache=lambda: None, changelog_lag=lambda p, c: 0, watchdog_s=20
    )
    registry.tasks = {p: Task(p, s, Role.ACTIVE, TaskStatus.RUNNING) for p, s in enumerate(stores)}
    registry.joined = True
    yield SimpleNamespace(registry=registry, stopping=False, settings=settings)
    for store in stores:
        store.close()


async def test_a_count_of_a_big_store_leaves_the_event_loop_running(engine):
    settings = Settings.from_env({}, app_id="unit")
    app = build_app(lambda: engine, "i1", "accounts", settings=settings)
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async with TestClient(TestServer(app)) as client:
        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        answer = await client.get("/v1/stores/accounts/count", params={"partitions": "0,1"})
        took = time.monotonic() - started
        ticker.cancel()
        ticks.append(time.monotonic())
        gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
        assert answer.status == 200, await answer.text()
        assert (await answer.json()) == {"count": 2 * KEYS_PER_PARTITION}
        ranged = await client.get(
            "/v1/stores/accounts/count", params={"partitions": "1", "prefix": "k-1-0000"}
        )
        assert (await ranged.json()) == {"count": 10_000}
    print(f"count of {2 * KEYS_PER_PARTITION} keys: {took:.2f} s, longest gap {max(gaps):.3f} s")
    assert took > 0.3, "too small a store to show a stall"
    assert max(gaps) < 0.25  # a slice is ~20 ms; the rest is this shared machine's scheduler
