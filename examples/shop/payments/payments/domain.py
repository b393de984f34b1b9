"""Payments: one payment per order, captured when its amount is within the limit.

Commands (JSON, keyed by order id):
    request  {order, amount}    stock reserved the order's items (reaction `stock`)

A payment is declined when the amount is above LIMIT euros; within it, an amount ending in
AWAITING waits for the customer's approval (3-D Secure), which never comes in this example;
any other is captured. This stands in for a card processor's answers and keeps the example
deterministic. Every answer is an event: orders confirms on `captured` and rejects on
`declined`; an `awaiting` payment answers nothing, so the order stays pending until orders'
checkout saga cancels it. Both functions are pure.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from enhydra import Aggregate, Rejection

LIMIT = 1000  # euros: larger payments are declined
AWAITING = 7  # an amount ending in this digit waits for an approval that never comes

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


class Awaiting(msgspec.Struct, tag="awaiting"):
    amount: int


Event = Captured | Declined | Awaiting


class Payment(msgspec.Struct):
    status: Literal["captured", "declined", "awaiting"]
    amount: int


def decide(state: Payment | None, command: Command) -> list[Event]:
    if state is not None:
        raise Rejection(f"payment already {state.status}")
    if command.amount > LIMIT:
        return [Declined(command.amount, LIMIT)]
    if command.amount % 10 == AWAITING:
        return [Awaiting(command.amount)]
    return [Captured(command.amount)]


def apply(state: Payment | None, event: Event) -> Payment:
    match event:
        case Captured(amount=amount):
            return Payment("captured", amount)
        case Declined(amount=amount):
            return Payment("declined", amount)
        case Awaiting(amount=amount):
            return Payment("awaiting", amount)
    raise ValueError(f"unknown event {event!r}")


payments = Aggregate(
    name="payments",
    decide=decide,
    apply=apply,
    command_types=(Request,),
    event_types=(Captured, Declined, Awaiting),
    state_type=Payment,
    description="Payments per order: captured, declined or awaiting approval, once.",
)
