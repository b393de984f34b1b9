"""The shop's three services on the real broker, each killed with SIGKILL once while orders flow.

Orders are placed, stock reserves (or refuses) their items, payments captures (or declines)
what was reserved, orders confirms or rejects, and stock releases what a declined order held:
four hops across three services, every one a reaction. While a few hundred orders flow, each
service is killed with SIGKILL once (its first instance commits offsets once a minute, so its
reactions read many events again and write their commands again) and started again on its
state directory. Afterwards every service's state, as its changelog restores it, equals the
model (tests/examples_shop/model.py); each service published one event per (command id,
index) the model counts, copies aside: no command lost, none applied twice.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from enhydra.kafka.clients import as_connection
from enhydra.kafka.reading import end_offsets
from enhydra.testing.invariants import check_service
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed
from tests.examples_shop.conftest import pythonpath
from tests.examples_shop.model import generate, model
from tests.integration.ledger_support import produce_in_chunks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# name -> (target, store, the services whose events it reacts to)
SERVICES = {
    "orders": ("orders.service:service", "orders", ("stock", "payments")),
    "stock": ("stock.service:service", "items", ("orders",)),
    "payments": ("payments.service:service", "payments", ("stock",)),
}
# kill each service once its engine has processed this share of the commands it will get
KILL_AT = {"orders": 0.2, "stock": 0.35, "payments": 0.5}
ORDERS = 400


def test_each_service_killed_mid_flow_ends_where_the_model_does(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    prefix = f"{app_id}-"
    shop = generate(ORDERS)
    expected = model(shop)

    def start(name: str, run: int, **extra: str):
        target = SERVICES[name][0]
        env = {
            "ENHYDRA_APP_ID": prefix + name,
            "SHOP_PREFIX": prefix,
            "PYTHONPATH": pythonpath(),
            **extra,
        }
        state = tmp_path / name
        return service_factory(target, f"{name}-{run}", state_dir=state, extra_env=env)

    rarely = {"ENHYDRA_COMMIT_INTERVAL_MS": "60000"}  # many events read again after the kill
    first = {name: start(name, 1, **rarely) for name in SERVICES}
    for instance in first.values():
        instance.wait_ready()
    asyncio.run(produce_json(kafka_bootstrap, f"{prefix}stock-commands", shop.restocks))
    killed: dict[str, int] = {}
    again = {}

    async def kill_when(name: str) -> None:
        instance, at = first[name], int(KILL_AT[name] * expected.events[name])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, stats = await asyncio.to_thread(instance.get, "/v1/stats")
            done = stats.get("processed", 0) if status == 200 else 0
            if done >= at:
                instance.kill()
                killed[name] = done
                again[name] = start(name, 2)
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} did not process {at} commands within 120 s")

    async def faults() -> None:
        await asyncio.gather(*(kill_when(name) for name in SERVICES))

    async def flow() -> None:
        topic = f"{prefix}orders-commands"
        place = produce_in_chunks(kafka_bootstrap, topic, shop.orders, chunk=10, pause=0.3)
        await asyncio.gather(place, faults())

    asyncio.run(flow())
    for instance in again.values():
        instance.wait_ready()
    asyncio.run(settled(kafka_bootstrap, prefix))

    # each kill came while its service still had commands to process (one command, one event)
    assert all(killed[name] < expected.events[name] for name in SERVICES), killed
    for name, (_, store, _) in SERVICES.items():
        verdict = asyncio.run(
            check_service(
                kafka_bootstrap,
                prefix + name,
                store,
                getattr(expected, name),
                expected_events=expected.events[name],
            )
        )
        print(f"{name} (killed after {killed[name]} commands):\n{verdict.summary()}")
        verdict.assert_holds()

    # The kills made copies of commands (events read again): the receivers skipped them.
    copies = 0
    for name in SERVICES:
        written = asyncio.run(read_topic(kafka_bootstrap, f"{prefix}{name}-commands"))
        ids = [json.loads(record.value)["command_id"] for record in written]
        copies += len(ids) - len(set(ids))
    print(f"{copies} command copies skipped")
    assert copies > 0, "no kill left a copy: the dedup path was not exercised"
    # One running instance answers for its keys over HTTP too (all partitions are its own).
    some = sorted(expected.orders)[:5]
    for order in some:
        status, body = again["orders"].get(f"/v1/stores/orders/keys/{order}")
        assert (status, body) == (200, expected.orders[order]), order


async def settled(bootstrap: str, prefix: str, timeout: float = 180) -> None:
    """Every group (aggregates and reactions) at the end of its input, twice in a row.

    A reaction's commands make events another reaction reads: the second pass finds the
    chain at rest only when the first pass left nothing new behind.
    """
    groups = []
    for name, (_, _, upstreams) in SERVICES.items():
        groups.append((prefix + name, f"{prefix}{name}-commands"))
        for source in upstreams:
            group = f"{prefix}{name}-reaction-{source}"
            groups.append((group, f"{prefix}{source}-events"))
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        before = await ends(bootstrap, [topic for _, topic in groups])
        for group, topic in groups:
            left = max(1.0, deadline - time.monotonic())
            await wait_for_committed(bootstrap, group, topic, timeout=left)
        quiet = quiet + 1 if await ends(bootstrap, [t for _, t in groups]) == before else 0


async def ends(bootstrap: str, topics: list[str]) -> dict[str, dict[int, int]]:
    conn = as_connection(bootstrap)
    return {topic: await end_offsets(conn, topic) for topic in sorted(set(topics))}
