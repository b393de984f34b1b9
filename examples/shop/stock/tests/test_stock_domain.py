"""Stock's rules and its reaction to orders, without a broker (the Driver runs the batch core)."""

from __future__ import annotations

from enhydra.testing import Driver

from stock.service import service


def placed(order: str, quantity: int) -> tuple[str, dict]:
    return order, {"type": "placed", "sku": "mug", "quantity": quantity, "amount": 10}


def test_a_placed_order_reserves_or_is_out_of_stock():
    d = Driver(service)
    d.send("mug", {"command_id": "r", "type": "restock", "sku": "mug", "quantity": 3})
    d.feed("orders", *placed("o1", 2))
    d.feed("orders", *placed("o2", 2))
    kinds = [type(e).__name__ for _, e in d.events]
    assert kinds == ["Restocked", "Reserved", "OutOfStock"]
    state = d.state("mug")
    assert (state.available, state.reserved, state.refused) == (1, 2, 1)
    assert d.events[-1][1].order == "o2"


def test_a_sku_never_restocked_has_nothing():
    d = Driver(service)
    d.feed("orders", *placed("o1", 1))
    assert type(d.events[-1][1]).__name__ == "OutOfStock"


def test_a_declined_order_releases_its_items_and_an_out_of_stock_one_does_not():
    d = Driver(service)
    d.send("mug", {"command_id": "r", "type": "restock", "sku": "mug", "quantity": 5})
    d.feed("orders", *placed("o1", 2))
    rejected = {"type": "rejected", "sku": "mug", "quantity": 2}
    d.feed("orders", "o1", {**rejected, "reason": "payment_declined"})
    assert (d.state("mug").available, d.state("mug").reserved) == (5, 0)
    assert d.feed("orders", "o2", {**rejected, "reason": "out_of_stock"}) == []


def test_a_cancelled_order_releases_its_items():
    d = Driver(service)
    d.send("mug", {"command_id": "r", "type": "restock", "sku": "mug", "quantity": 5})
    d.feed("orders", *placed("o1", 2))
    cancelled = {"type": "cancelled", "reason": "unpaid", "sku": "mug", "quantity": 2}
    [outcome] = d.feed("orders", "o1", cancelled)
    assert outcome.accepted
    assert (d.state("mug").available, d.state("mug").reserved) == (5, 0)
    assert d.events[-1][1].order == "o1"


def test_orders_events_stock_does_not_read_are_ignored():
    d = Driver(service)
    assert d.feed("orders", "o1", {"type": "confirmed"}) == []
    assert d.events == []


def test_a_release_of_more_than_is_reserved_is_rejected():
    d = Driver(service)
    command = {"command_id": "x", "type": "release", "sku": "mug", "order": "o", "quantity": 1}
    assert d.send("mug", command).rejection == "cannot release 1: 0 reserved"
