"""trade-stats on a real broker: the windowed state per symbol equals the model's, late trades
are on the rejections topic, and the committed topology.json is still what the code deploys."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from trade_stats.service import service
from trade_stats.workload import SYMBOLS, generate, model

from enhydra.testing.processes import produce_json, read_topic, wait_for_committed
from enhydra.topology import compare, topology_of, validate
from tests.upgrades.conftest import TRADE_STATS_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_windowed_averages_match_the_model(
    service_factory: Any, kafka_bootstrap: str, app_id: str
) -> None:
    instance = service_factory("trade_stats.service:service", cwd=TRADE_STATS_ROOT)
    instance.wait_ready()
    stream = generate(3_000, seed=17)

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", stream)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands")

    asyncio.run(produce_and_wait())
    expected, late = model(stream)
    for symbol in SYMBOLS:
        assert instance.get(f"/v1/stores/trade-stats/keys/{symbol}") == (200, expected[symbol])
    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    assert sorted(json.loads(r.value)["command_id"] for r in rejections) == sorted(late)


def test_committed_topology_is_compatible() -> None:
    deployed = validate(
        json.loads((TRADE_STATS_ROOT / "topology.json").read_text()), "topology.json"
    )
    assert [c for c in compare(deployed, topology_of(service)) if not c.compatible] == []
