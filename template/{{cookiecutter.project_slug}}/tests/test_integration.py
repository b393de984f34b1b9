"""One real instance on a real broker: what Kafka delivers must end where the model says.

Needs a Kafka broker: the `kafka_bootstrap` fixture uses $ENHYDRA_TEST_BOOTSTRAP when set (e.g.
from `enhydra kafka start`), and otherwise starts a local broker for the test session.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from enhydra.testing import Driver
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed

from {{ cookiecutter.package_name }}.domain import items

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ITEMS = [f"item-{n}" for n in range(8)]


def commands() -> list[tuple[str, dict[str, Any]]]:
    """Accepted and rejected commands for several items, spread over the partitions."""
    out: list[tuple[str, dict[str, Any]]] = []

    def send(item: str, command_id: str, kind: str, quantity: int | None = None) -> None:
        command: dict[str, Any] = {"command_id": command_id, "type": kind, "item": item}
        if quantity is not None:
            command["quantity"] = quantity
        out.append((item, command))

    for n, item in enumerate(ITEMS):
        send(item, f"{item}-register", "register")
        for round_ in range(3):
            send(item, f"{item}-receive-{round_}", "receive", 10 + n + round_)
            send(item, f"{item}-ship-{round_}", "ship", 5 + round_)
        send(item, f"{item}-ship-too-many", "ship", 1000)  # rejected: not enough on hand
        send(item, f"{item}-receive-0", "receive", 99)  # rejected: duplicate command id
    send("item-unknown", "unknown-ship", "ship", 1)  # rejected: never registered
    return out


def test_final_state_matches_the_model(
    service_factory: Any, kafka_bootstrap: str, app_id: str
) -> None:
    instance = service_factory("{{ cookiecutter.package_name }}.service:service", cwd=PROJECT_ROOT)
    instance.wait_ready()
    sent = commands()

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", sent)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands")

    asyncio.run(produce_and_wait())

    model = Driver(items)
    model.send_many(sent)
    for item in ITEMS:
        status, body = instance.get(f"/v1/stores/items/keys/{item}")
        assert (status, body) == (200, model.state(item)), item
    status, _ = instance.get("/v1/stores/items/keys/item-unknown")
    assert status == 404

    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    published = sorted(
        (r["command_id"], r["reason"]) for r in (json.loads(rec.value) for rec in rejections)
    )
    assert published == sorted((r["command_id"], r["reason"]) for r in model.rejections)
    assert len(published) == 2 * len(ITEMS) + 1

    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    per_key: dict[str, list[Any]] = {}
    for record in events:
        per_key.setdefault(record.key.decode(), []).append(json.loads(record.value))
    expected: dict[str, list[Any]] = {}
    for key, event in model.events:
        expected.setdefault(key, []).append(event)
    assert per_key == expected
