"""An input topic written under exactly-once (a reaction's commands, a saga's inbox) ends with
a transaction marker: an offset with no record. An idle service must read it as no work
waiting, or the watchdog reports every caught-up task stuck and /health/live fails; and its
group must commit through it, or every lag monitor outside reads the idle service as behind."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from enhydra.kafka.clients import as_connection, open_producer
from enhydra.testing.processes import http_get, wait_for_committed
from ledger.workload import generate

pytestmark = [pytest.mark.integration, pytest.mark.timing]


async def produce_in_transactions(bootstrap: str, topic: str, commands: list, size: int) -> None:
    conn = as_connection(bootstrap)
    async with open_producer(conn, transactional_id=f"{topic}-writer", acks="all") as producer:
        for at in range(0, len(commands), size):
            async with producer.transaction():
                for key, value in commands[at : at + size]:
                    await producer.send(topic, json.dumps(value).encode(), key=key.encode())


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_an_idle_service_after_a_transactional_input_is_live_with_no_lag(
    kafka_bootstrap, app_id, service_factory, guarantee
) -> None:
    service = service_factory(
        "ledger.service:service",
        extra_env={
            "ENHYDRA_TASK_WATCHDOG_MS": "2000",
            "ENHYDRA_PROCESSING_GUARANTEE": guarantee,
        },
    )
    topic = f"{app_id}-commands"
    asyncio.run(produce_in_transactions(kafka_bootstrap, topic, generate(20, 120, seed=3), 30))
    # The group commits through the last marker: committed offset == end offset everywhere
    # (what kafka-consumer-groups and lag exporters compare), not one short of it.
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, topic, timeout=90))
    lags: dict = {}
    deadline = time.monotonic() + 90
    while not lags or set(lags.values()) != {0}:
        assert time.monotonic() < deadline, f"still waiting: {lags}"
        time.sleep(0.5)
        lags = input_lag(service.url)
    deadline = time.monotonic() + 6  # three watchdog limits past the last command
    while time.monotonic() < deadline:
        assert status(service.url + "/health/live") == 200, service.log_tail(30)
        time.sleep(0.5)
    assert set(input_lag(service.url).values()) == {0}
    assert "task stuck" not in service.log_tail(400)


def input_lag(url: str) -> dict:
    code, body = http_get(url + "/v1/stats")
    assert code == 200, body
    return body.get("input_lag") or {}
