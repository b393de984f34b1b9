"""The `checkout` saga: an order unpaid in time is cancelled once; a settled one never is.

The Driver runs the saga as the service does (forwarder, inbox, store of deadlines) on a clock
it moves with `advance`; orders' own events are fed to it as its forwarder reads them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from enhydra.testing import Driver
from enhydra.topology import topology_of

from orders.sagas.checkout import DEFAULT_UNPAID_AFTER_S, UNPAID_AFTER_S, saga, unpaid_after
from orders.service import service

APP = "orders"
AFTER = UNPAID_AFTER_S


class Orders(Driver):
    """A Driver that remembers how many of orders' events the saga was given."""

    fed = 0


def place(driver: Orders, order: str) -> None:
    """Place `order`, and hand the saga the events that made (as its forwarder would)."""
    command = {"type": "place", "order": order, "sku": "mug", "quantity": 2, "amount": 30}
    assert driver.send(order, {"command_id": f"p-{order}", **command}).accepted
    follow(driver)


def follow(driver: Orders) -> list:
    """Feed the saga orders' events it has not seen yet; the outcomes of what it sent."""
    outcomes = []
    while driver.fed < len(driver.events):
        key, event = driver.events[driver.fed]
        driver.fed += 1
        outcomes += driver.feed_saga("checkout", APP, key, msgspec.to_builtins(event))
    return outcomes


@pytest.fixture
def driver() -> Orders:
    return Orders(service)


def test_an_unpaid_order_is_cancelled_once_when_its_deadline_comes(driver: Orders) -> None:
    place(driver, "o1")
    assert driver.deadlines("checkout", "o1") == {"unpaid": AFTER}
    assert driver.advance(AFTER - 1) == []
    [outcome] = driver.advance(1)
    assert outcome.accepted and [type(e).__name__ for e in outcome.events] == ["Cancelled"]
    state = driver.state("o1")
    assert (state.status, state.reason) == ("cancelled", "unpaid")
    assert follow(driver) == []  # `cancelled` ends the saga
    assert driver.saga_state("checkout", "o1") is None
    assert driver.advance(10 * AFTER) == []


@pytest.mark.parametrize(
    "answer",
    [{"type": "confirm"}, {"type": "reject", "reason": "payment_declined"}],
    ids=["confirmed", "rejected"],
)
def test_an_order_settled_in_time_is_never_cancelled(driver: Orders, answer: dict) -> None:
    place(driver, "o1")
    driver.advance(AFTER - 1)
    assert driver.send("o1", {"command_id": "a1", "order": "o1", **answer}).accepted
    follow(driver)
    assert driver.deadlines("checkout", "o1") == {}
    assert driver.saga_state("checkout", "o1") is None  # the saga ended
    assert driver.advance(10 * AFTER) == []
    assert driver.state("o1").status != "cancelled"


def test_a_payment_captured_after_the_cancel_is_ignored(driver: Orders) -> None:
    place(driver, "o1")
    driver.advance(AFTER)
    late = driver.send("o1", {"command_id": "late", "type": "confirm", "order": "o1"})
    assert late.rejection == "order is cancelled"
    assert driver.state("o1").status == "cancelled"


def test_a_redelivered_placed_does_not_move_the_deadline(driver: Orders) -> None:
    place(driver, "o1")
    driver.advance(AFTER / 2)
    _, placed = driver.events[0]
    driver.feed_saga("checkout", APP, "o1", msgspec.to_builtins(placed), offset=0)
    assert driver.deadlines("checkout", "o1") == {"unpaid": AFTER}


def test_the_deadline_is_a_setting_with_a_production_default() -> None:
    assert unpaid_after({}) == DEFAULT_UNPAID_AFTER_S == 900
    assert unpaid_after({"SHOP_UNPAID_AFTER_S": "4.5"}) == 4.5
    for bad in ("soon", "0", "-3", "nan"):
        with pytest.raises(ValueError, match="a number of seconds above 0"):
            unpaid_after({"SHOP_UNPAID_AFTER_S": bad})


def test_a_bad_deadline_setting_stops_the_service_with_one_line() -> None:
    env = {**os.environ, "SHOP_UNPAID_AFTER_S": "soon"}
    root = Path(__file__).resolve().parents[1]
    start = [sys.executable, "-c", "import orders.service"]
    done = subprocess.run(start, cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "orders: SHOP_UNPAID_AFTER_S='soon': give a number of seconds above 0, e.g. 900"
    )


def test_the_service_runs_it() -> None:
    assert saga in service.sagas
    [entry] = [s for s in topology_of(service)["sagas"] if s["name"] == "checkout"]
    assert entry["inbox"] == f"{APP}-checkout-saga-inbox"
    assert entry["sources"] == sorted(saga.sources)
