"""The shop's three services wired together in memory: the rules, the reactions, the model.

Each service runs in its own Driver (the batch core the Kafka engine runs); a small bus hands
every event a service publishes to the reactions and sagas that read its topic, each event
twice at the same offset (Kafka redelivering it), until nothing new happens; then the clock
moves past the checkout saga's deadline, whose cancels start the bus again. The end states
equal the model that the broker test (test_shop_flow.py) holds the real services to, so a
difference there is a fault of running, not of the rules.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from orders.sagas.checkout import UNPAID_AFTER_S
from orders.service import service as orders_service
from payments.service import service as payments_service
from stock.service import service as stock_service

from enhydra import Service
from enhydra.testing import Driver
from tests.examples_shop.model import generate, model

SERVICES: dict[str, Service] = {
    "orders": orders_service,
    "stock": stock_service,
    "payments": payments_service,
}


def builtins(state: Any) -> Any:
    return msgspec.to_builtins(state)


def run_shop(orders: int) -> tuple[dict[str, Driver], Any]:
    shop = generate(orders)
    drivers = {name: Driver(service) for name, service in SERVICES.items()}
    drivers["stock"].send_many(shop.restocks)
    drivers["orders"].send_many(shop.orders)
    read = {name: 0 for name in drivers}  # events of each service handed on so far
    offsets: dict[tuple[str, str], int] = {}

    def next_offset(place: tuple[str, str]) -> int:
        offsets[place] = offsets.get(place, -1) + 1
        return offsets[place]

    fired = -1
    while fired:  # until the deadlines due fire nothing more
        moved = True
        while moved:
            moved = False
            for source, upstream in drivers.items():
                fresh = upstream.events[read[source] :]
                read[source] = len(upstream.events)
                for key, event in fresh:
                    moved = True
                    for name, driver in drivers.items():
                        for reaction in driver.reactions.values():
                            if reaction.source != source:
                                continue
                            offset = next_offset((name, reaction.name))
                            driver.feed(reaction, key, event, offset=offset)
                            again = driver.feed(reaction, key, event, offset=offset)
                            assert all(o.rejection == "duplicate command_id" for o in again)
                        for saga in driver.sagas.values():
                            if source not in saga.sources:
                                continue
                            offset = next_offset((name, saga.name))
                            plain = builtins(event)
                            driver.feed_saga(saga, source, key, plain, offset=offset)
                            assert driver.feed_saga(saga, source, key, plain, offset=offset) == []
        fired = len(drivers["orders"].advance(UNPAID_AFTER_S))
    return drivers, model(shop)


def states(driver: Driver) -> dict[str, Any]:
    return {key: builtins(driver.state(key)) for key in driver.stored_keys()}


def test_three_services_end_where_the_model_does():
    drivers, expected = run_shop(300)
    assert states(drivers["orders"]) == expected.orders
    assert states(drivers["stock"]) == expected.stock
    assert states(drivers["payments"]) == expected.payments
    for name, driver in drivers.items():
        assert len(driver.events) == expected.events[name], name
    statuses = {o["status"] + o["reason"] for o in expected.orders.values()}
    assert statuses == {
        "confirmed",
        "rejectedout_of_stock",
        "rejectedpayment_declined",
        "cancelledunpaid",
    }
    # each unpaid order cancelled once, by its deadline; no deadline left pending
    orders = drivers["orders"]
    cancelled = [key for key, event in orders.events if type(event).__name__ == "Cancelled"]
    unpaid = [key for key, o in expected.orders.items() if o["status"] == "cancelled"]
    assert sorted(cancelled) == unpaid and len(unpaid) > 10
    assert all(orders.deadlines("checkout", key) == {} for key in expected.orders)


def test_the_model_refuses_a_stream_whose_outcome_depends_on_the_order():
    shop = generate(50)
    shop.stock = {sku: 6 for sku in shop.stock}  # enough for some orders on a sku, not all
    with pytest.raises(AssertionError, match="depends on the order"):
        model(shop)
