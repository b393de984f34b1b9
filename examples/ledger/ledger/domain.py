"""The ledger: accounts that open, take deposits and withdrawals, and close.

Commands (JSON, keyed by account id):
    {"command_id": str, "type": "open"|"deposit"|"withdraw"|"close",
     "account": str, "amount": int}

State per account: {"balance": int, "status": "open"|"closed", "version": int}, where version is
the number of events applied. Balances are in euros. Topics follow the app id: with the default
app id `ledger` they are ledger-commands, ledger-events and ledger-rejections. Both functions
are pure: the streaming service and the PySpark backfill run exactly this code.

Events: opened, deposited, withdrawn, closed. `deposited` is at version 2 and names its
currency, {"type": "deposited", "amount": int, "currency": "EUR"}; version 1 had no currency
(every deposit was in euros) and `deposited_v1_to_v2` reads it as version 2. Events are kept
forever, so the history written by the first version stays readable by this code.
"""

from __future__ import annotations

from typing import Any

from enhydra import Aggregate, InvalidCommand, Rejection

COMMAND_TYPES = ("open", "deposit", "withdraw", "close")
CURRENCY = "EUR"  # the currency of every balance


def parse(command: dict[str, Any]) -> dict[str, Any]:
    """The command's shape: a known type, an account, a positive whole amount where needed.

    A malformed command is a sender's bug, not a business answer: the service sends it to the
    dead-letter queue (InvalidCommand) instead of publishing a rejection.
    """
    kind = command.get("type")
    if kind not in COMMAND_TYPES:
        expected = ", ".join(COMMAND_TYPES)
        raise InvalidCommand(f"unknown command type {kind!r}; expected one of {expected}")
    account = command.get("account")
    if not isinstance(account, str) or not account:
        raise InvalidCommand("account must be a non-empty string")
    if kind in ("deposit", "withdraw"):
        amount = command.get("amount")
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidCommand(f"amount must be a whole number, got {amount!r}")
        if amount <= 0:
            raise InvalidCommand(f"amount must be greater than 0, got {amount}")
    return command


def decide(state: dict[str, Any] | None, command: dict[str, Any]) -> list[dict[str, Any]]:
    """Check a well-formed command against the account and say what happened."""
    kind = command["type"]
    if kind == "open":
        if state is not None:
            raise Rejection("account already exists")
        return [{"type": "opened"}]
    if state is None or state["status"] != "open":
        raise Rejection("account is not open")
    if kind == "deposit":
        return [{"type": "deposited", "amount": command["amount"], "currency": CURRENCY}]
    if kind == "withdraw":
        amount = command["amount"]
        if amount > state["balance"]:
            raise Rejection(f"insufficient funds: balance {state['balance']}, asked {amount}")
        return [{"type": "withdrawn", "amount": amount}]
    if state["balance"] != 0:
        raise Rejection(f"balance must be 0 to close, is {state['balance']}")
    return [{"type": "closed"}]


def apply(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    """The only way an account changes."""
    kind = event["type"]
    if kind == "opened":
        return {"balance": 0, "status": "open", "version": 1}
    assert state is not None, f"{kind} before opened"
    if kind == "deposited":
        if event["currency"] != CURRENCY:
            raise ValueError(f"deposit in {event['currency']!r}: balances are in {CURRENCY}")
        balance = state["balance"] + event["amount"]
    elif kind == "withdrawn":
        balance = state["balance"] - event["amount"]
    elif kind == "closed":
        return {**state, "status": "closed", "version": state["version"] + 1}
    else:
        raise ValueError(f"unknown event type {kind!r}")
    return {**state, "balance": balance, "version": state["version"] + 1}


def deposited_v1_to_v2(event: dict[str, Any]) -> dict[str, Any]:
    """deposited v1 {amount} -> v2 {amount, currency}: the first version only took euros."""
    return {**event, "currency": CURRENCY}


accounts = Aggregate(
    name="accounts",
    decide=decide,
    apply=apply,
    parse=parse,
    event_versions={"deposited": 2},
    upcasters={("deposited", 1): deposited_v1_to_v2},
    description="Bank accounts: balance, status and the number of events applied.",
)
