"""The shop's three services wired together in memory: the rules, the reactions, the model.

Each service runs in its own Driver (the batch core the Kafka engine runs); a small bus hands
every event a service publishes to the reactions that read its topic, each event twice at the
same offset (Kafka redelivering it), until nothing new happens. The end states equal the
model that the broker test (test_shop_flow.py) holds the real services to, so a difference
there is a fault of running, not of the rules.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
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
                        place = (name, reaction.name)
                        offset = offsets.get(place, 0)
                        offsets[place] = offset + 1
                        driver.feed(reaction, key, event, offset=offset)
                        again = driver.feed(reaction, key, event, offset=offset)
                        assert all(o.rejection == "duplicate command_id" for o in again)
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
    assert statuses == {"confirmed", "rejectedout_of_stock", "rejectedpayment_declined"}


def test_the_model_refuses_a_stream_whose_outcome_depends_on_the_order():
    shop = generate(50)
    shop.stock = {sku: 6 for sku in shop.stock}  # enough for some orders on a sku, not all
    with pytest.raises(AssertionError, match="depends on the order"):
        model(shop)
