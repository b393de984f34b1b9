"""The domain rules, run through the same batch core as the service but without a broker."""

from __future__ import annotations

from typing import Any

import pytest
from enhydra.testing import Driver

from {{ cookiecutter.package_name }}.domain import apply, decide, items
from {{ cookiecutter.package_name }}.service import service


def cmd(command_id: str, kind: str, item: str = "apple", **fields: Any) -> dict[str, Any]:
    return {"command_id": command_id, "type": kind, "item": item, **fields}


@pytest.fixture
def driver() -> Driver:
    return Driver(service)


@pytest.fixture
def stocked(driver: Driver) -> Driver:
    """An apple item with 10 on hand."""
    assert driver.send("apple", cmd("c1", "register")).accepted
    assert driver.send("apple", cmd("c2", "receive", quantity=10)).accepted
    return driver


def test_register_receive_ship(driver: Driver) -> None:
    registered = driver.send("apple", cmd("c1", "register"))
    assert registered.events == [{"type": "registered", "item": "apple"}]
    received = driver.send("apple", cmd("c2", "receive", quantity=5))
    assert received.events == [{"type": "received", "quantity": 5}]
    shipped = driver.send("apple", cmd("c3", "ship", quantity=3))
    assert shipped.events == [{"type": "shipped", "quantity": 3}]
    assert driver.state("apple") == {"on_hand": 2, "version": 3}
    assert driver.rejections == []


def test_shipping_everything_on_hand_is_allowed(stocked: Driver) -> None:
    assert stocked.send("apple", cmd("c3", "ship", quantity=10)).accepted
    assert stocked.state("apple") == {"on_hand": 0, "version": 3}


def test_keys_are_independent(driver: Driver) -> None:
    driver.send_many(
        [
            ("apple", cmd("a1", "register")),
            ("pear", cmd("p1", "register", item="pear")),
            ("pear", cmd("p2", "receive", item="pear", quantity=7)),
        ]
    )
    assert driver.state("apple") == {"on_hand": 0, "version": 1}
    assert driver.state("pear") == {"on_hand": 7, "version": 2}
    assert driver.state("plum") is None


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("r1", "register"), "item 'apple' is already registered"),
        (cmd("r2", "ship", quantity=11), "cannot ship 11 of 'apple': only 10 on hand"),
    ],
)
def test_rejections_leave_state_unchanged(
    stocked: Driver, command: dict[str, Any], reason: str
) -> None:
    outcome = stocked.send("apple", command)
    assert not outcome.accepted
    assert outcome.events == []
    assert outcome.rejection is not None and outcome.rejection.startswith(reason)
    assert stocked.state("apple") == {"on_hand": 10, "version": 2}
    assert stocked.rejections[-1]["command_id"] == command["command_id"]


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("r3", "receive", quantity=0), "quantity must be greater than 0, got 0"),
        (cmd("r4", "ship", quantity=-2), "quantity must be greater than 0, got -2"),
        (cmd("r5", "receive", quantity="3"), "quantity must be a whole number, got '3'"),
        (cmd("r6", "receive", quantity=True), "quantity must be a whole number, got True"),
        (cmd("r7", "receive"), "quantity must be a whole number, got None"),
        (cmd("r8", "sell", quantity=1), "unknown command type 'sell'"),
        (cmd("r9", "receive", item="", quantity=1), "item must be a non-empty string"),
    ],
)
def test_malformed_commands_are_failures_for_the_dead_letter_queue(
    stocked: Driver, command: dict[str, Any], reason: str
) -> None:
    outcome = stocked.send("apple", command)
    assert not outcome.accepted and outcome.rejection is None
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error).startswith(reason)
    assert stocked.state("apple") == {"on_hand": 10, "version": 2}


@pytest.mark.parametrize("kind", ["receive", "ship"])
def test_unregistered_item_is_rejected(driver: Driver, kind: str) -> None:
    outcome = driver.send("plum", cmd("c1", kind, item="plum", quantity=1))
    assert outcome.rejection == "item 'plum' is not registered"
    assert driver.state("plum") is None


def test_duplicate_command_id_is_rejected_not_applied(stocked: Driver) -> None:
    outcome = stocked.send("apple", cmd("c2", "receive", quantity=10))
    assert outcome.rejection == "duplicate command_id"
    assert stocked.state("apple") == {"on_hand": 10, "version": 2}


def test_invalid_json_is_a_failure_with_a_reason(driver: Driver) -> None:
    outcome = driver.send("apple", b"{not json")
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error).startswith("value is not valid JSON")
    assert driver.rejections == [] and driver.state("apple") is None


def test_command_without_id_is_a_failure(driver: Driver) -> None:
    outcome = driver.send("apple", {"type": "register", "item": "apple"})
    assert outcome.failure is not None
    assert str(outcome.failure.error) == "command has no 'command_id' (a non-empty string)"


def test_version_counts_applied_events(driver: Driver) -> None:
    driver.send("apple", cmd("c1", "register"))
    for n in range(2, 7):
        driver.send("apple", cmd(f"c{n}", "receive", quantity=n))
    assert driver.state("apple") == {"on_hand": 2 + 3 + 4 + 5 + 6, "version": 6}


def test_apply_is_pure() -> None:
    before = {"on_hand": 4, "version": 2}
    after = apply(before, {"type": "shipped", "quantity": 1})
    assert after == {"on_hand": 3, "version": 3}
    assert before == {"on_hand": 4, "version": 2}


def test_decide_does_not_change_state() -> None:
    state = {"on_hand": 4, "version": 2}
    decide(state, cmd("c1", "ship", quantity=4))
    assert state == {"on_hand": 4, "version": 2}


def test_service_wiring() -> None:
    assert service.aggregate is items
    assert items.name == "items"
