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
from samples import command

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
    """Accepted and rejected commands for several keys, spread over the partitions.

    Each is built from its declared type (tests/samples.py): fields the test does not name get
    a sample of their type, so a new field in a command needs no edit here.
    """
    out: list[tuple[str, dict[str, Any]]] = []

    def send(key: str, command_id: str, kind: str, **fields: Any) -> None:
        out.append((key, command(kind, key, command_id, **fields)))

    for n, key in enumerate(KEYS):
        send(key, f"{key}-create", CREATE, name=f"name-{n}")
        for round_ in range(3):
            for kind in OTHERS:
                send(key, f"{key}-{kind}-{round_}", kind, note=f"{kind} {round_} of {n}")
        send(key, f"{key}-create-again", CREATE)  # rejected: it exists
        send(key, f"{key}-create", CREATE)  # rejected: duplicate command id
    send("missing", "missing-0", (OTHERS or [CREATE])[0])  # rejected unless it creates
    return out


# Rejected whatever the rules: a second create of a key, and (with other command types) a
# command for a key never created. Duplicate command ids are skipped, not rejected.
EXPECTED_REJECTIONS = {f"{key}-create-again" for key in KEYS} | ({"missing-0"} if OTHERS else set())


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
    assert not model.failures, (
        "commands() in tests/test_integration.py sent commands the service cannot take: "
        f"{model.failures[0]}"
    )
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
    assert {command_id for command_id, _ in published} >= EXPECTED_REJECTIONS

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
