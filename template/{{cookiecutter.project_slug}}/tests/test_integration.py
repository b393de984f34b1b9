"""One real instance on a real broker: what Kafka delivers must end where the model says.

Needs a Kafka broker: the `kafka_bootstrap` fixture uses $ENHYDRA_TEST_BOOTSTRAP when set (e.g.
from `enhydra kafka start`), and otherwise starts a local broker for the test session.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from enhydra.contracts.headers import EVENT_VERSION_HEADER
from enhydra.testing import Driver
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed

from {{ cookiecutter.package_name }}.domain import (
    COMMAND_TYPES,
    EVENT_TYPES,
    EVENT_VERSIONS,
    KEY_FIELD,
    {{ cookiecutter.aggregate }},
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
KEYS = [f"{KEY_FIELD}-{n}" for n in range(8)]
CREATE, *OTHERS = COMMAND_TYPES


def commands() -> list[tuple[str, dict[str, Any]]]:
    """Accepted and rejected commands for several keys, spread over the partitions."""
    out: list[tuple[str, dict[str, Any]]] = []

    def send(key: str, command_id: str, kind: str, **fields: Any) -> None:
        command = {"command_id": command_id, "type": kind, KEY_FIELD: key, **fields}
        out.append((key, command))

    for n, key in enumerate(KEYS):
        send(key, f"{key}-create", CREATE, name=f"name-{n}")
        for round_ in range(3):
            for kind in OTHERS:
                send(key, f"{key}-{kind}-{round_}", kind, note=f"{kind} {round_} of {n}")
        send(key, f"{key}-create-again", CREATE)  # rejected: it exists
        send(key, f"{key}-create", CREATE)  # rejected: duplicate command id
    send("missing", "missing-0", (OTHERS or [CREATE])[0])  # rejected unless it creates
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

    model = Driver({{ cookiecutter.aggregate }})
    model.send_many(sent)
    for key in KEYS:
        status, body = instance.get(f"/v1/stores/{{ cookiecutter.aggregate }}/keys/{key}")
        assert (status, body) == (200, msgspec.to_builtins(model.state(key))), key
    status, _ = instance.get("/v1/stores/{{ cookiecutter.aggregate }}/keys/missing")
    assert status == (404 if OTHERS else 200)

    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    published = sorted(
        (r["command_id"], r["reason"]) for r in (json.loads(rec.value) for rec in rejections)
    )
    assert published == sorted((r["command_id"], r["reason"]) for r in model.rejections)
    assert len(published) == 2 * len(KEYS) + (1 if OTHERS else 0)

    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    per_key: dict[str, list[Any]] = {}
    for record in events:
        per_key.setdefault(record.key.decode(), []).append(json.loads(record.value))
    modelled: dict[str, list[Any]] = {}
    for key, event in model.events:
        modelled.setdefault(key, []).append(msgspec.to_builtins(event))
    assert per_key == modelled
    # Every event carries the version of its type's shape: what readers upcast from.
    versions = {
        (json.loads(r.value)["type"], dict(r.headers)[EVENT_VERSION_HEADER]) for r in events
    }
    expected = {(e, str(EVENT_VERSIONS.get(e, 1)).encode()) for e in EVENT_TYPES.values()}
    assert versions == expected
