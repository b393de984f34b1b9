"""A plugin installed next to the ledger adds a queryable projection; a broken one stops it.

The plugin is installed with pip into a private directory put on the instance's PYTHONPATH:
the same entry-point discovery as a site-packages install, without extending the ledgers that
other tests start from the shared environment.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from enhydra.projections import replay_projection
from enhydra.testing import Driver
from enhydra.testing.processes import ServiceProcess, read_topic, wait_for_committed
from ledger.domain import accounts
from ledger.workload import generate
from tests.integration.ledger_support import feed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TARGET = "ledger.service:service"


def read_store(instances: list[ServiceProcess], store: str, keys: list[str]) -> dict[str, Any]:
    """Every key of a store from the instance hosting it (421: not here; 404: no such key)."""
    found: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    for key in keys:
        while True:
            answers = [inst.get(f"/v1/stores/{store}/keys/{key}") for inst in instances]
            if all(status != 503 for status, _ in answers) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        hits = [body for status, body in answers if status == 200]
        assert all(hit == hits[0] for hit in hits), answers  # forwarded answers agree
        if hits:
            found[key] = hits[0]
        else:
            assert all(status in (404, 421) for status, _ in answers), answers
    return found


async def republish_last(bootstrap: str, topic: str, *, per_partition: int) -> None:
    records = await read_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in {r.partition for r in records}:
            for r in [r for r in records if r.partition == partition][-per_partition:]:
                await producer.send(
                    topic, r.value, key=r.key, partition=partition, headers=list(r.headers)
                )
        await producer.flush()
    finally:
        await producer.stop()


def test_installed_plugin_adds_a_queryable_projection(
    service_factory: Any, kafka_bootstrap: str, app_id: str, plugin_site: Path
) -> None:
    env = {"PYTHONPATH": str(plugin_site)}
    instances = [service_factory(TARGET, f"i{n}", extra_env=env) for n in (1, 2)]
    for instance in instances:
        instance.wait_ready()
    commands = generate(40, 600, seed=21)
    feed(kafka_bootstrap, app_id, commands)
    asyncio.run(
        wait_for_committed(
            kafka_bootstrap, f"{app_id}-projection-activity", f"{app_id}-events", timeout=60
        )
    )
    # What an instance killed between publishing a batch's events and writing its changelog
    # does when the batch is redelivered: the same events, headers included, published again.
    asyncio.run(republish_last(kafka_bootstrap, f"{app_id}-events", per_partition=50))
    asyncio.run(
        wait_for_committed(
            kafka_bootstrap, f"{app_id}-projection-activity", f"{app_id}-events", timeout=60
        )
    )

    from ledger_audit import activity  # the plugin's own code is the model's projection

    driver = Driver(accounts)
    driver.send_many(commands)
    expected = replay_projection(activity, driver.events)
    keys = sorted({key for key, _ in commands})
    assert read_store(instances, "activity", keys) == expected
    assert read_store(instances, "accounts", keys) == {
        k: driver.state(k) for k in driver.stored_keys()
    }

    status, stats = instances[0].get("/v1/stats")
    assert status == 200
    assert [p["name"] for p in stats["plugins"]] == ["ledger-audit"]
    assert stats["plugins"][0]["projections"] == ["activity"]
    assert "ledger-audit (ledger-audit 0.1.0)" in instances[0].log_path.read_text()
    status, body = instances[0].get("/v1/stores/nothing/keys/x")
    assert status == 404 and body["stores"] == ["accounts", "activity"]


def test_a_plugin_that_fails_to_import_stops_the_start_naming_it(
    service_factory: Any, tmp_path: Path
) -> None:
    site = tmp_path / "broken-site"
    dist = site / "broken_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[enhydra.handlers]\nbroken = broken_plugin:plugin\n")
    (site / "broken_plugin.py").write_text("raise ImportError('no module named numpyy')\n")
    instance = service_factory(TARGET, extra_env={"PYTHONPATH": str(site)})
    assert instance.process is not None
    assert instance.process.wait(60) == 1
    log = instance.log_path.read_text()
    assert "plugin failed to load" in log
    assert "plugin 'broken' (entry point 'broken_plugin:plugin' of broken-plugin 1.0)" in log
    assert "ImportError: no module named numpyy" in log
