"""The ledger's rules through the in-memory driver: the batch core of the service, no broker."""

from __future__ import annotations

import pytest
from enhydra import replay
from enhydra.testing import Driver

from ledger.domain import accounts
from ledger.workload import generate, model


def cmd(cid: str, kind: str, amount: int | None = None, account: str = "a") -> dict:
    body = {"command_id": cid, "type": kind, "account": account}
    if amount is not None:
        body["amount"] = amount
    return body


@pytest.fixture
def driver() -> Driver:
    d = Driver(accounts)
    assert d.send("a", cmd("o", "open")).accepted
    return d


def test_open_deposit_withdraw_close(driver: Driver) -> None:
    assert driver.send("a", cmd("1", "deposit", 70)).events == [{"type": "deposited", "amount": 70}]
    assert driver.send("a", cmd("2", "withdraw", 70)).accepted
    assert driver.send("a", cmd("3", "close")).events == [{"type": "closed"}]
    assert driver.state("a") == {"balance": 0, "status": "closed", "version": 4}


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("x", "withdraw", 1), "insufficient funds: balance 0, asked 1"),
        (cmd("x", "deposit", 0), "amount must be greater than 0"),
        (cmd("x", "deposit", -5), "amount must be greater than 0"),
        (cmd("x", "deposit", "5"), "amount must be a whole number"),
        (cmd("x", "deposit"), "amount must be a whole number"),
        (cmd("x", "open"), "account already exists"),
        (cmd("x", "refund", 5), "unknown command type 'refund'"),
    ],
)
def test_rejections_leave_state_alone(driver: Driver, command: dict, reason: str) -> None:
    outcome = driver.send("a", command)
    assert not outcome.accepted
    assert outcome.rejection is not None and outcome.rejection.startswith(reason)
    assert driver.state("a") == {"balance": 0, "status": "open", "version": 1}
    assert driver.rejections[-1]["command_id"] == "x"


def test_commands_need_an_open_account() -> None:
    d = Driver(accounts)
    assert d.send("b", cmd("1", "deposit", 5, "b")).rejection == "account is not open"
    d.send("b", cmd("2", "open", account="b"))
    d.send("b", cmd("3", "close", account="b"))
    assert d.send("b", cmd("4", "deposit", 5, "b")).rejection == "account is not open"


def test_close_needs_zero_balance(driver: Driver) -> None:
    driver.send("a", cmd("1", "deposit", 5))
    assert driver.send("a", cmd("2", "close")).rejection == "balance must be 0 to close, is 5"


def test_repeated_command_id_is_a_duplicate(driver: Driver) -> None:
    assert driver.send("a", cmd("1", "deposit", 5)).accepted
    assert driver.send("a", cmd("1", "deposit", 5)).rejection == "duplicate command_id"
    assert driver.state("a")["balance"] == 5


def test_rejected_command_may_be_retried_with_the_same_id(driver: Driver) -> None:
    assert not driver.send("a", cmd("w", "withdraw", 5)).accepted
    driver.send("a", cmd("d", "deposit", 5))
    assert driver.send("a", cmd("w", "withdraw", 5)).accepted


def test_unreadable_commands_are_rejected_with_a_reason() -> None:
    d = Driver(accounts)
    outcome = d.send("a", b"{not json")
    assert outcome.rejection.startswith("invalid command: value is not valid JSON")
    assert d.send("a", b"[1, 2]").rejection == "invalid command: command must be a JSON object"
    assert d.send("a", {"type": "open"}).rejection == (
        "invalid command: command has no 'command_id' (a non-empty string)"
    )
    assert d.rejections[0]["command"] == "{not json"


def test_state_is_the_fold_of_the_events(driver: Driver) -> None:
    driver.send_many([("a", cmd(str(i), "deposit", i + 1)) for i in range(20)])
    events = [e for key, e in driver.events if key == "a"]
    assert replay(accounts, events) == driver.state("a")


def test_domain_agrees_with_the_independent_model() -> None:
    commands = generate(200, 5000, seed=3)
    d = Driver(accounts)
    d.send_many(commands)
    expected = model(commands)
    assert {key: d.state(key) for key in d.stored_keys()} == expected
