"""Payments' rules and its reaction to stock, without a broker (the Driver runs the batch core)."""

from __future__ import annotations

from enhydra.testing import Driver

from payments.domain import AWAITING, LIMIT
from payments.service import service


def reserved(order: str, amount: int) -> dict:
    return {"type": "reserved", "order": order, "quantity": 1, "amount": amount}


def test_a_reservation_asks_for_the_payment_of_its_order():
    d = Driver(service)
    [outcome] = d.feed("stock", "mug", reserved("o1", LIMIT))
    assert outcome.accepted
    assert d.stored_keys() == ["o1"]
    assert (d.state("o1").status, d.state("o1").amount) == ("captured", LIMIT)


def test_above_the_limit_is_declined():
    d = Driver(service)
    d.feed("stock", "mug", reserved("o1", LIMIT + 1))
    assert d.state("o1").status == "declined"
    assert d.events[-1][1].limit == LIMIT


def test_an_amount_ending_in_awaiting_waits_and_answers_nothing_orders_reads():
    d = Driver(service)
    d.feed("stock", "mug", reserved("o1", 10 + AWAITING))
    assert (d.state("o1").status, d.events[-1][1].amount) == ("awaiting", 10 + AWAITING)
    d.feed("stock", "mug", reserved("o2", LIMIT + 10 + AWAITING))
    assert d.state("o2").status == "declined"  # above the limit: declined, whatever its digit


def test_an_order_is_paid_once():
    d = Driver(service)
    d.feed("stock", "mug", reserved("o1", 5))
    [again] = d.feed("stock", "mug", reserved("o1", 5), offset=0)
    assert again.rejection == "duplicate command_id"
    later = d.send("o1", {"command_id": "other", "type": "request", "order": "o1", "amount": 5})
    assert later.rejection == "payment already captured"


def test_stock_events_payments_does_not_read_are_ignored():
    d = Driver(service)
    assert d.feed("stock", "mug", {"type": "out_of_stock", "order": "o1", "quantity": 1}) == []
