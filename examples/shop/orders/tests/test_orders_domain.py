"""Orders' rules and reactions, without a broker (the Driver runs the batch core)."""

from __future__ import annotations

import pytest
from enhydra.testing import Driver

from orders.service import service

PLACE = {"type": "place", "order": "o1", "sku": "mug", "quantity": 2, "amount": 30}


@pytest.fixture
def driver() -> Driver:
    d = Driver(service)
    assert d.send("o1", {"command_id": "p1", **PLACE}).accepted
    return d


def status(driver: Driver, order: str = "o1") -> str:
    return driver.state(order).status


def test_a_placed_order_is_pending_with_what_stock_and_payments_need(driver: Driver):
    [event] = driver.events[-1:]
    assert event[0] == "o1" and (event[1].sku, event[1].quantity, event[1].amount) == ("mug", 2, 30)
    assert status(driver) == "pending"
    assert driver.send("o1", {"command_id": "p2", **PLACE}).rejection == "order already placed"


def test_captured_confirms_and_declined_rejects(driver: Driver):
    [outcome] = driver.feed("payments", "o1", {"type": "captured", "amount": 30})
    assert outcome.accepted and status(driver) == "confirmed"
    d = Driver(service)
    d.send("o2", {"command_id": "p", **PLACE, "order": "o2"})
    d.feed("payments", "o2", {"type": "declined", "amount": 30, "limit": 10})
    assert (d.state("o2").status, d.state("o2").reason) == ("rejected", "payment_declined")


def test_out_of_stock_rejects_and_the_rejection_names_what_to_release(driver: Driver):
    event = {"type": "out_of_stock", "order": "o1", "quantity": 2, "available": 0}
    driver.feed("stock", "mug", event)
    assert (status(driver), driver.state("o1").reason) == ("rejected", "out_of_stock")
    rejected = driver.events[-1][1]
    assert (rejected.sku, rejected.quantity) == ("mug", 2)


def test_a_settled_order_does_not_move_again(driver: Driver):
    driver.feed("payments", "o1", {"type": "captured", "amount": 30})
    late = driver.send(
        "o1", {"command_id": "r", "type": "reject", "order": "o1", "reason": "out_of_stock"}
    )
    assert late.rejection == "order is confirmed"
    assert status(driver) == "confirmed"


def test_cancel_settles_a_pending_order_only(driver: Driver):
    """What a deadline ("unpaid after N seconds") will send; a paid order stays paid."""
    cancel = {"type": "cancel", "order": "o1"}
    assert driver.send("o1", {"command_id": "c1", **cancel}).accepted
    assert (status(driver), driver.state("o1").reason) == ("cancelled", "unpaid")
    cancelled = driver.events[-1][1]
    assert (cancelled.sku, cancelled.quantity) == ("mug", 2)
    [late] = driver.feed("payments", "o1", {"type": "captured", "amount": 30})
    assert late.rejection == "order is cancelled"
    assert driver.send("nope", {"command_id": "c2", **cancel, "order": "nope"}).rejection == (
        "no such order"
    )


def test_a_redelivered_answer_is_skipped(driver: Driver):
    driver.feed("payments", "o1", {"type": "captured", "amount": 30}, offset=7)
    [again] = driver.feed("payments", "o1", {"type": "captured", "amount": 30}, offset=7)
    assert again.rejection == "duplicate command_id"


def test_a_malformed_place_is_refused_at_the_edge():
    outcome = Driver(service).send("o9", {"command_id": "x", **PLACE, "quantity": 0})
    assert outcome.failure is not None and "quantity" in str(outcome.failure.error)
