"""Sagas on the real broker: the checkout saga cancels unpaid orders when their deadline fires.

The saga reads the shop's own events and a payments service's (produced here straight into
`<app>-payments-events`, keyed by payment id, so re-keying by order id is needed). Every
order's state is read from the shop; the receiver (the orders aggregate) counts the cancels
it applied, and the commands topic holds each cancel's id.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from enhydra.testing.processes import produce_json, read_topic
from tests.integration.ledger_support import ask_all, produce_in_chunks
from tests.query.test_status_page import browse, chromium

SHOP = "tests.sagas.checkout_service:service"

pytestmark = pytest.mark.integration


def places(orders: list[str]) -> list[tuple[str, dict]]:
    return [
        (o, {"type": "place", "order": o, "amount": 1, "command_id": f"place-{o}"}) for o in orders
    ]


def captures(orders: list[str]) -> list[tuple[str, dict]]:
    return [(f"pay-{o}", {"type": "captured", "order": o}) for o in orders]


def saga_stats(instance) -> dict:
    status, stats = instance.get("/v1/stats")
    return (stats.get("sagas") or {}).get("checkout", {}) if status == 200 else {}


def read_orders(instance, orders: list[str]) -> dict[str, dict]:
    found = {}
    for order in orders:
        [(status, body)] = ask_all([instance], f"/v1/stores/orders/keys/{order}")
        found[order] = body if status == 200 else None
    return found


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout} s")


def cancels_in(kafka_bootstrap: str, topic: str) -> list[str]:
    written = asyncio.run(read_topic(kafka_bootstrap, topic))
    commands = [json.loads(record.value) for record in written]
    return [c["command_id"] for c in commands if c.get("type") == "cancel"]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_unpaid_orders_are_cancelled_once_and_paid_ones_never(
    service_factory, kafka_bootstrap, app_id, tmp_path, guarantee
):
    payments = f"{app_id}-payments"
    env = {
        "CHECKOUT_UNPAID_S": "3",
        "CHECKOUT_PAYMENTS": payments,
        "ENHYDRA_PROCESSING_GUARANTEE": guarantee,
    }
    shop = service_factory(SHOP, "s1", extra_env=env)
    shop.wait_ready()
    orders = [f"o{n}" for n in range(40)]
    paid, unpaid = orders[::2], orders[1::2]

    async def flow() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", places(orders))
        await produce_json(kafka_bootstrap, f"{payments}-events", captures(paid))

    asyncio.run(flow())
    wait_until(lambda: saga_stats(shop).get("fired", 0) >= len(unpaid), 60, "every deadline fired")

    def settled():
        # a fired deadline's cancel is a command the aggregate applies a moment later
        states = read_orders(shop, orders)
        done = all(states.values()) and all(states[o]["status"] == "cancelled" for o in unpaid)
        return states if done else None

    states = wait_until(settled, 30, "every unpaid order cancelled")
    assert {o: s["status"] for o, s in states.items()} == {
        **{o: "placed" for o in paid},
        **{o: "cancelled" for o in unpaid},
    }
    assert all(states[o]["cancels"] == 1 for o in unpaid)
    time.sleep(1)
    stats = saga_stats(shop)
    assert stats["fired"] == len(unpaid) and stats["deadlines_pending"] == 0
    # a payment may reach the saga before its order's `placed` (another topic): that order
    # never gets a deadline, so every deadline scheduled was either cancelled or fired
    assert stats["scheduled"] == stats["cancelled"] + stats["fired"]
    assert stats["cancelled"] <= len(paid) and stats["failures"] == {}
    assert set(stats["forwarders"]) == {app_id, payments}
    ids = cancels_in(kafka_bootstrap, f"{app_id}-commands")
    assert sorted(ids) == sorted(f"checkout:{o}:deadline:unpaid:1" for o in unpaid)
    with urllib.request.urlopen(shop.url + "/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert f'enhydra_saga_deadlines_fired_total{{saga="checkout"}} {len(unpaid)}' in metrics
    assert 'enhydra_saga_deadlines_pending{saga="checkout"} 0' in metrics
    # the status page's line for the saga (a real browser renders it)
    dom = browse(chromium(), tmp_path / "profile", shop.url + "/", "--dump-dom")
    row = re.search(r'<tr data-saga="checkout" data-instance="s1">(.*?)</tr>', dom.stdout)
    assert row, dom.stdout[-3000:]
    assert '<td class="pending">0</td>' in row.group(1)
    assert f'<td class="fired">{len(unpaid)}</td>' in row.group(1)


def test_a_source_partitioned_otherwise_stops_the_start_with_one_line(
    service_factory, kafka_bootstrap, app_id
):
    """The saga re-keys its sources into its inbox, but every topic of the service has its
    partition count: a source with another count is refused at start, before any event."""
    payments = f"{app_id}-payments"

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(f"{payments}-events", 2, 1)])
        finally:
            await admin.close()

    asyncio.run(create())
    shop = service_factory(SHOP, "s1", extra_env={"CHECKOUT_PAYMENTS": payments})
    assert shop.process is not None and shop.process.wait(60) != 0
    line = f"topic '{payments}-events' has 2 partitions but the service expects 4"
    assert line in shop.log_tail(200)
    assert "Traceback" not in shop.log_tail(200)


UNPAID_S = 5.0
FAULT_ENV = {"CHECKOUT_UNPAID_S": str(UNPAID_S), "ENHYDRA_COMMIT_INTERVAL_MS": "60000"}


def order_flow(kafka_bootstrap: str, app_id: str) -> tuple[list[str], set[str], list[str]]:
    """300 orders placed over ~5 s, a third paid right after being placed (same key, so the
    saga sees the payment after the order): (orders, payers, unpaid)."""
    orders = [f"o{n}" for n in range(300)]
    payers = set(orders[::3])
    commands = []
    for order, place in places(orders):
        commands.append((order, place))
        if order in payers:
            commands.append((order, {"type": "pay", "order": order, "command_id": f"pay-{order}"}))
    topic = f"{app_id}-commands"
    asyncio.run(produce_in_chunks(kafka_bootstrap, topic, commands, chunk=40, pause=0.6))
    return orders, payers, [o for o in orders if o not in payers]


def kill_with_deadlines_due(instance) -> dict:
    """Once deadlines fire, freeze `instance` (SIGSTOP) until every deadline pending in it is
    due, then kill -9 it; its saga stats just before the freeze."""
    before = wait_until(
        lambda: s if (s := saga_stats(instance)).get("fired", 0) >= 20 else None, 60, "fires"
    )
    assert instance.process is not None
    instance.process.send_signal(signal.SIGSTOP)
    time.sleep(UNPAID_S + 1)
    instance.kill()
    assert before["deadlines_pending"] > 0, before
    return before


def check_each_fired_once(kafka_bootstrap, app_id, survivor, orders, payers, unpaid) -> int:
    """Every unpaid order cancelled exactly once at the receiver, paid ones never, nothing
    pending; the cancel ids are the deadlines'. Returns the copies skipped by id."""

    def all_cancelled():
        states = read_orders(survivor, orders)
        done = all(states[o] and states[o]["status"] == "cancelled" for o in unpaid)
        return states if done else None

    wait_until(all_cancelled, 90, "every unpaid order cancelled")
    time.sleep(2)  # a late copy would have arrived by now
    states = read_orders(survivor, orders)
    assert [o for o in unpaid if states[o]["cancels"] != 1] == []
    assert [o for o in payers if states[o]["status"] != "paid"] == []
    assert saga_stats(survivor)["deadlines_pending"] == 0
    ids = cancels_in(kafka_bootstrap, f"{app_id}-commands")
    assert set(ids) == {f"checkout:{o}:deadline:unpaid:1" for o in unpaid}
    return len(ids) - len(set(ids))


@pytest.mark.slow
def test_kill_9_with_deadlines_pending_and_due_fires_each_exactly_once(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    """kill -9 of the only instance while deadlines are pending and due (kill_with_deadlines_due);
    the restarted instance (same state dir) fires each once: the receiver applies one cancel
    per unpaid order, and copies sent around the crash carry the same id."""
    shop = service_factory(SHOP, "s1", state_dir=tmp_path / "s1", extra_env=FAULT_ENV)
    shop.wait_ready()
    orders, payers, unpaid = order_flow(kafka_bootstrap, app_id)
    before = kill_with_deadlines_due(shop)
    again = service_factory(SHOP, "s1-again", state_dir=tmp_path / "s1", extra_env=FAULT_ENV)
    again.wait_ready()
    copies = check_each_fired_once(kafka_bootstrap, app_id, again, orders, payers, unpaid)
    print(
        f"killed after {before['fired']} fired, {before['deadlines_pending']} pending; "
        f"{len(unpaid)} unpaid orders cancelled once ({copies} copies skipped by id); "
        f"{saga_stats(again)['duplicates']} inbox records skipped as already handled"
    )


@pytest.mark.slow
def test_failover_moves_pending_deadlines_to_the_other_instance(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    """Two instances; one is killed with deadlines pending and due. The other takes over its
    saga partitions, restores their state and deadlines from the changelog (it never held
    them), and fires each once."""
    first = service_factory(SHOP, "s1", state_dir=tmp_path / "s1", extra_env=FAULT_ENV)
    second = service_factory(SHOP, "s2", state_dir=tmp_path / "s2", extra_env=FAULT_ENV)
    first.wait_ready()
    second.wait_ready()
    wait_until(
        lambda: saga_stats(first).get("partitions") and saga_stats(second).get("partitions"),
        60,
        "the saga's partitions shared by both instances",
    )
    orders, payers, unpaid = order_flow(kafka_bootstrap, app_id)
    before = kill_with_deadlines_due(first)
    wait_until(lambda: len(saga_stats(second).get("partitions") or {}) == 4, 60, "takeover")
    copies = check_each_fired_once(kafka_bootstrap, app_id, second, orders, payers, unpaid)
    print(
        f"failover after {before['fired']} fired, {before['deadlines_pending']} pending on "
        f"the killed instance; {copies} copies skipped by id"
    )
