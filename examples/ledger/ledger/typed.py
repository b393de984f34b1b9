"""The ledger declared with types: the same accounts, commands and events as msgspec Structs.

Same topics, same JSON on the wire and in the store as ledger.domain (a test holds them to
it), so either can run against the other's history. What typing adds: a command that does not
fit its type (an amount of "5", a missing account) is refused at the edge with the field
named, decide and apply read attributes instead of dict keys, and `enhydra topology check` and
`enhydra asyncapi` see each type's JSON Schema. `make bench` runs this service next to the
untyped one (`enhydra-typed`) to show what the validation costs.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from enhydra import Aggregate, Rejection, Service

from ledger.service import service as untyped_service

CURRENCY = "EUR"
Amount = Annotated[int, msgspec.Meta(gt=0, description="euros, a whole number above 0")]
AccountId = Annotated[str, msgspec.Meta(min_length=1)]


# Commands: the "type" field of the JSON picks the Struct (its tag).
class Open(msgspec.Struct, tag="open"):
    account: AccountId


class Deposit(msgspec.Struct, tag="deposit"):
    account: AccountId
    amount: Amount


class Withdraw(msgspec.Struct, tag="withdraw"):
    account: AccountId
    amount: Amount


class Close(msgspec.Struct, tag="close"):
    account: AccountId


Command = Open | Deposit | Withdraw | Close


# Events
class Opened(msgspec.Struct, tag="opened"):
    pass


class Deposited(msgspec.Struct, tag="deposited"):
    """Version 2: version 1 had no currency (every deposit was in euros)."""

    amount: int
    currency: Literal["EUR"] = CURRENCY


class Withdrawn(msgspec.Struct, tag="withdrawn"):
    amount: int


class Closed(msgspec.Struct, tag="closed"):
    pass


Event = Opened | Deposited | Withdrawn | Closed


class Account(msgspec.Struct):
    balance: int
    status: Literal["open", "closed"]
    version: int  # the number of events applied


def decide(state: Account | None, command: Command) -> list[Event]:
    match command:
        case Open():
            if state is not None:
                raise Rejection("account already exists")
            return [Opened()]
    if state is None or state.status != "open":
        raise Rejection("account is not open")
    match command:
        case Deposit(amount=amount):
            return [Deposited(amount)]
        case Withdraw(amount=amount):
            if amount > state.balance:
                raise Rejection(f"insufficient funds: balance {state.balance}, asked {amount}")
            return [Withdrawn(amount)]
    if state.balance != 0:
        raise Rejection(f"balance must be 0 to close, is {state.balance}")
    return [Closed()]


def apply(state: Account | None, event: Event) -> Account:
    match event:
        case Opened():
            return Account(balance=0, status="open", version=1)
        case Deposited(amount=amount):
            assert state is not None, "deposited before opened"
            return Account(state.balance + amount, state.status, state.version + 1)
        case Withdrawn(amount=amount):
            assert state is not None, "withdrawn before opened"
            return Account(state.balance - amount, state.status, state.version + 1)
        case Closed():
            assert state is not None, "closed before opened"
            return Account(state.balance, "closed", state.version + 1)
    raise ValueError(f"unknown event {event!r}")


def deposited_v1_to_v2(event: dict) -> dict:
    """Upcasters work on the stored JSON, before it becomes a Deposited."""
    return {**event, "currency": CURRENCY}


accounts = Aggregate(
    name="accounts",
    decide=decide,
    apply=apply,
    command_types=(Open, Deposit, Withdraw, Close),
    event_types=(Opened, Deposited, Withdrawn, Closed),
    state_type=Account,
    event_versions={"deposited": 2},
    upcasters={("deposited", 1): deposited_v1_to_v2},
    description="Bank accounts (typed): balance, status and the number of events applied.",
)

# the same service settings as the untyped ledger (ledger.service), around this aggregate
service = Service("ledger", accounts, **untyped_service.defaults)
