"""The shop's three services on the real broker, each killed with SIGKILL once while orders flow
and the checkout saga's deadlines are pending and coming due.

Orders are placed, stock reserves (or refuses) their items, payments captures, declines, or
leaves awaiting (never answered) what was reserved, orders confirms or rejects, stock releases
what a declined order held; orders' checkout saga cancels an order still unpaid UNPAID_AFTER_S
seconds after it was placed, and stock releases a cancelled order's items. Once the first
deadlines have fired and orders are still arriving, each service is killed with SIGKILL in turn
(its first instance commits offsets once a minute, so its reactions and the saga read many
events again and write their commands again) and started again on its state directory; the
deadlines due while orders is down fire when it is back. Afterwards every service's state, as
its changelog restores it, equals the model (tests/examples_shop/model.py); each service
published one event per (command id, index) the model counts, copies aside; every unpaid
order got one cancel command id and one cancelled event, and no other order either.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

import pytest

from enhydra.contracts.headers import COMMAND_ID_HEADER
from enhydra.kafka.clients import as_connection
from enhydra.kafka.reading import end_offsets
from enhydra.testing.invariants import check_service
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed
from tests.examples_shop.conftest import pythonpath
from tests.examples_shop.model import generate, model
from tests.integration.ledger_support import produce_in_chunks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

# name -> (target, store, the services whose events it reacts to)
SERVICES = {
    "orders": ("orders.service:service", "orders", ("stock", "payments")),
    "stock": ("stock.service:service", "items", ("orders",)),
    "payments": ("payments.service:service", "payments", ("stock",)),
}
SAGA_SOURCES = ("orders",)  # the checkout saga (in orders) reads orders' own events
ORDERS = 400
PAUSE = 0.75  # between chunks of 10 orders: about 30 s of orders arriving
# Longer than an answer takes while services are killed one after the other (their restarts
# overlap), so only the orders payments never answers are cancelled and the model is exact.
UNPAID_AFTER_S = 20.0
STAGGER = 1.0  # seconds between the kills of stock, payments and orders


def test_each_service_killed_while_orders_flow_and_deadlines_fire_ends_where_the_model_does(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    prefix = f"{app_id}-"
    shop = generate(ORDERS)
    expected = model(shop)
    unpaid = {o for o, state in expected.orders.items() if state["status"] == "cancelled"}

    def start(name: str, run: int, **extra: str):
        target = SERVICES[name][0]
        env = {
            "ENHYDRA_APP_ID": prefix + name,
            "SHOP_PREFIX": prefix,
            "SHOP_UNPAID_AFTER_S": str(UNPAID_AFTER_S),
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
    at_kill: dict[str, dict] = {}  # the saga's stats when each service was killed
    again = {}
    placing = {"done": False}
    began = time.monotonic()

    async def kill(name: str) -> None:
        saga = await asyncio.to_thread(saga_stats, first["orders"])
        status, stats = await asyncio.to_thread(first[name].get, "/v1/stats")
        first[name].kill()
        killed[name] = stats.get("processed", 0) if status == 200 else 0
        at_kill[name] = {"t": round(time.monotonic() - began, 1), "fired": saga.get("fired", 0)}
        at_kill[name]["pending"] = saga.get("deadlines_pending", 0)
        at_kill[name]["placing"] = not placing["done"]
        at_kill[name]["next_due"] = saga.get("next_deadline") or 0
        down = time.time()
        again[name] = start(name, 2)
        await asyncio.to_thread(again[name].wait_ready)
        at_kill[name]["down_s"] = round(time.time() - down, 1)
        at_kill[name]["back"] = time.time()

    async def faults() -> None:
        """Once deadlines fire and orders still arrive: kill stock, payments, then orders."""
        deadline = time.monotonic() + 120
        while not (await asyncio.to_thread(saga_stats, first["orders"])).get("fired"):
            assert time.monotonic() < deadline, "no deadline fired within 120 s"
            await asyncio.sleep(0.1)
        kills = []
        for name in ("stock", "payments", "orders"):
            kills.append(asyncio.create_task(kill(name)))
            await asyncio.sleep(STAGGER)
        await asyncio.gather(*kills)

    async def flow() -> None:
        topic = f"{prefix}orders-commands"
        await produce_in_chunks(kafka_bootstrap, topic, shop.orders, chunk=10, pause=PAUSE)
        placing["done"] = True

    async def both() -> None:
        await asyncio.gather(flow(), faults())

    asyncio.run(both())
    asyncio.run(settled(kafka_bootstrap, prefix, again["orders"]))
    print(f"settled after {time.monotonic() - began:.1f} s; at each kill: {at_kill}")

    # each kill came while its service still had commands to process (one command, one event)
    assert all(killed[name] < expected.events[name] for name in SERVICES), killed
    # ... while orders arrived and the saga had deadlines pending, some of them fired already;
    # and one came due while orders (which runs the saga) was down
    assert all(s["placing"] and s["pending"] and s["fired"] for s in at_kill.values()), at_kill
    assert at_kill["orders"]["next_due"] < at_kill["orders"]["back"], at_kill
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

    # Every unpaid order cancelled exactly once: one cancel command id for it at the receiver
    # (copies of that id aside), one cancelled event; no order that was answered cancelled.
    # (A deadline may still fire for an order whose answer the saga had not read yet, as
    # after orders' restart: orders had confirmed it first and rejects that cancel.)
    cancels = asyncio.run(cancel_commands(kafka_bootstrap, prefix))
    assert unpaid <= set(cancels), sorted(unpaid - set(cancels))
    assert all(ids == {f"checkout:{o}:deadline:unpaid:1"} for o, ids in cancels.items())
    cancelled = asyncio.run(cancelled_events(kafka_bootstrap, prefix))
    assert cancelled == {order: 1 for order in unpaid}
    late = sorted(set(cancels) - unpaid)
    print(f"{len(late)} cancels of answered orders, rejected by orders: {late[:5]}")
    saga = saga_stats(again["orders"])
    print(f"{len(unpaid)} unpaid orders cancelled; saga on the second orders instance: {saga}")
    assert saga["deadlines_pending"] == 0 and saga["failures"] == {}

    # The kills made copies of commands (events read again): the receivers skipped them.
    copies = 0
    for name in SERVICES:
        written = asyncio.run(read_topic(kafka_bootstrap, f"{prefix}{name}-commands"))
        ids = [json.loads(record.value)["command_id"] for record in written]
        copies += len(ids) - len(set(ids))
    print(f"{copies} command copies skipped")
    assert copies > 0, "no kill left a copy: the dedup path was not exercised"
    # One running instance answers for its keys over HTTP too (all partitions are its own).
    some = sorted(expected.orders)[:5] + sorted(unpaid)[:2]
    for order in some:
        status, body = again["orders"].get(f"/v1/stores/orders/keys/{order}")
        assert (status, body) == (200, expected.orders[order]), order


def saga_stats(instance) -> dict:
    """The checkout saga's numbers on `instance` ({} while it does not answer)."""
    try:
        status, stats = instance.get("/v1/stats")
    except OSError:
        return {}
    return (stats.get("sagas") or {}).get("checkout", {}) if status == 200 else {}


async def cancel_commands(bootstrap: str, prefix: str) -> dict[str, set[str]]:
    """order -> the ids of the cancel commands written for it to orders' commands topic."""
    ids: dict[str, set[str]] = defaultdict(set)
    for record in await read_topic(bootstrap, f"{prefix}orders-commands"):
        command = json.loads(record.value)
        if command.get("type") == "cancel":
            ids[command["order"]].add(command["command_id"])
    return dict(ids)


async def cancelled_events(bootstrap: str, prefix: str) -> dict[str, int]:
    """order -> how many cancelled events orders published for it, one per command id."""
    seen: dict[str, set[bytes]] = defaultdict(set)
    for record in await read_topic(bootstrap, f"{prefix}orders-events"):
        if json.loads(record.value).get("type") == "cancelled":
            command_id = dict(record.headers).get(COMMAND_ID_HEADER, b"")
            seen[record.key.decode()].add(command_id)
    return {order: len(ids) for order, ids in seen.items()}


async def settled(bootstrap: str, prefix: str, orders, timeout: float = 180) -> None:
    """No deadline pending, and every group (aggregates, reactions, the saga and its
    forwarders) at the end of its input, twice in a row.

    A reaction's commands make events another reaction reads: the second pass finds the
    chain at rest only when the first pass left nothing new behind.
    """
    groups = []
    for name, (_, _, upstreams) in SERVICES.items():
        groups.append((prefix + name, f"{prefix}{name}-commands"))
        for source in upstreams:
            group = f"{prefix}{name}-reaction-{source}"
            groups.append((group, f"{prefix}{source}-events"))
    groups.append((f"{prefix}orders-saga-checkout", f"{prefix}orders-checkout-saga-inbox"))
    for source in SAGA_SOURCES:
        group = f"{prefix}orders-reaction-checkout-from-{prefix}{source}"
        groups.append((group, f"{prefix}{source}-events"))
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        while (await asyncio.to_thread(saga_stats, orders)).get("deadlines_pending", 1):
            assert time.monotonic() < deadline, "deadlines still pending"
            await asyncio.sleep(0.3)
        before = await ends(bootstrap, [topic for _, topic in groups])
        for group, topic in groups:
            left = max(1.0, deadline - time.monotonic())
            await wait_for_committed(bootstrap, group, topic, timeout=left)
        quiet = quiet + 1 if await ends(bootstrap, [t for _, t in groups]) == before else 0


async def ends(bootstrap: str, topics: list[str]) -> dict[str, dict[int, int]]:
    conn = as_connection(bootstrap)
    return {topic: await end_offsets(conn, topic) for topic in sorted(set(topics))}
