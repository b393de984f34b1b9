"""Payments: one payment per order, captured when its amount is within the limit.

Commands (JSON, keyed by order id):
    request  {order, amount}    stock reserved the order's items (reaction `stock`)

A payment is captured when the amount is at most LIMIT euros, and declined otherwise (a
stand-in for a card processor's answer that keeps the example deterministic). Both answers are
events: orders confirms or rejects the order on them. Both functions are pure.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from enhydra import Aggregate, Rejection

LIMIT = 1000  # euros: larger payments are declined

OrderId = Annotated[str, msgspec.Meta(min_length=1)]


class Request(msgspec.Struct, tag="request"):
    order: OrderId
    amount: Annotated[int, msgspec.Meta(gt=0)]


Command = Request


class Captured(msgspec.Struct, tag="captured"):
    amount: int


class Declined(msgspec.Struct, tag="declined"):
    amount: int
    limit: int


Event = Captured | Declined


class Payment(msgspec.Struct):
    status: Literal["captured", "declined"]
    amount: int


def decide(state: Payment | None, command: Command) -> list[Event]:
    if state is not None:
        raise Rejection(f"payment already {state.status}")
    if command.amount > LIMIT:
        return [Declined(command.amount, LIMIT)]
    return [Captured(command.amount)]


def apply(state: Payment | None, event: Event) -> Payment:
    match event:
        case Captured(amount=amount):
            return Payment("captured", amount)
        case Declined(amount=amount):
            return Payment("declined", amount)
    raise ValueError(f"unknown event {event!r}")


payments = Aggregate(
    name="payments",
    decide=decide,
    apply=apply,
    command_types=(Request,),
    event_types=(Captured, Declined),
    state_type=Payment,
    description="Payments per order: captured or declined, once.",
)
