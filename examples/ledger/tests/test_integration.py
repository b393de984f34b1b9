"""One real ledger instance on a real broker: every balance must end where the model says.

Needs a Kafka broker: the `kafka_bootstrap` fixture uses $ENHYDRA_TEST_BOOTSTRAP when set (e.g.
from `enhydra kafka start`), and otherwise starts a local broker for the test session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed

from ledger.workload import generate, model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_final_balances_match_the_model(
    service_factory: Any, kafka_bootstrap: str, app_id: str
) -> None:
    instance = service_factory("ledger.service:service", cwd=PROJECT_ROOT)
    instance.wait_ready()
    commands = generate(150, 1500, seed=9)

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", commands)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands")

    asyncio.run(produce_and_wait())

    expected = model(commands)
    for account in sorted({key for key, _ in commands}):
        status, body = instance.get(f"/v1/stores/accounts/keys/{account}")
        if account in expected:
            assert (status, body) == (200, expected[account]), account
        else:
            assert status == 404, (account, body)
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    assert len(events) == sum(state["version"] for state in expected.values())
