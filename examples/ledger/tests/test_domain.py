"""The ledger's rules through the in-memory driver: the batch core of the service, no broker."""

from __future__ import annotations

import pytest
from enhydra import replay
from enhydra.evolution import EventVersionError, upcast
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
    assert driver.send("a", cmd("1", "deposit", 70)).events == [
        {"type": "deposited", "amount": 70, "currency": "EUR"}
    ]
    assert driver.send("a", cmd("2", "withdraw", 70)).accepted
    assert driver.send("a", cmd("3", "close")).events == [{"type": "closed"}]
    assert driver.state("a") == {"balance": 0, "status": "closed", "version": 4}


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("x", "withdraw", 1), "insufficient funds: balance 0, asked 1"),
        (cmd("x", "open"), "account already exists"),
    ],
)
def test_rejections_leave_state_alone(driver: Driver, command: dict, reason: str) -> None:
    outcome = driver.send("a", command)
    assert not outcome.accepted
    assert outcome.rejection is not None and outcome.rejection.startswith(reason)
    assert driver.state("a") == {"balance": 0, "status": "open", "version": 1}
    assert driver.rejections[-1]["command_id"] == "x"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("x", "deposit", 0), "amount must be greater than 0, got 0"),
        (cmd("x", "deposit", -5), "amount must be greater than 0, got -5"),
        (cmd("x", "deposit", "5"), "amount must be a whole number, got '5'"),
        (cmd("x", "deposit"), "amount must be a whole number, got None"),
        (cmd("x", "refund", 5), "unknown command type 'refund'"),
        ({"command_id": "x", "type": "open"}, "account must be a non-empty string"),
    ],
)
def test_malformed_commands_are_failures_for_the_dead_letter_queue(
    driver: Driver, command: dict, reason: str
) -> None:
    outcome = driver.send("a", command)
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error).startswith(reason)
    assert outcome.rejection is None and driver.rejections == []
    assert driver.state("a") == {"balance": 0, "status": "open", "version": 1}


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


def test_unreadable_records_are_failures_with_a_reason() -> None:
    d = Driver(accounts)
    reasons = [str(d.send("a", raw).failure.error) for raw in (b"{not json", b"[1, 2]")]
    assert reasons[0].startswith("value is not valid JSON")
    assert reasons[1] == "command must be a JSON object"
    assert str(d.send("a", {"type": "open"}).failure.error) == (
        "command has no 'command_id' (a non-empty string)"
    )
    assert all(f.stage == "deserialize" for f in d.failures)


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


def test_deposited_v1_reads_as_v2_in_euros() -> None:
    """The first version's deposits had no currency: they were all in euros."""
    v1 = {"type": "deposited", "amount": 30}
    assert upcast(accounts, v1, 1) == {"type": "deposited", "amount": 30, "currency": "EUR"}
    assert v1 == {"type": "deposited", "amount": 30}  # the stored event is not changed
    with pytest.raises(EventVersionError, match="'deposited' at version 3"):
        upcast(accounts, v1, 3)


def test_history_of_v1_deposits_continues_under_v2() -> None:
    d = Driver(accounts)
    d.given("a", [{"type": "opened"}, {"type": "deposited", "amount": 30}], version=1)
    assert d.send("a", cmd("1", "deposit", 12)).accepted
    assert d.send("a", cmd("2", "withdraw", 42)).accepted
    assert d.state("a") == {"balance": 0, "status": "open", "version": 4}
