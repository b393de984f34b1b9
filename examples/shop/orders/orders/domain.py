"""Orders: an order is placed, then confirmed or rejected by what stock and payments answer.

Commands (JSON, keyed by order id; "type" picks the Struct):
    place    {order, sku, quantity, amount}   a customer places an order (from outside)
    confirm  {order}                          its payment was captured (reaction `payments`)
    reject   {order, reason}                  out of stock (reaction `stock`) or payment
                                              declined (reaction `payments`)
    cancel   {order, reason}                  a pending order is given up: the checkout
                                              saga's deadline (orders/sagas/checkout.py)

Only a pending order moves, and it moves once: confirmed, rejected and cancelled are final, so
a late answer for a settled order is a rejection (in orders-rejections), never a second change.
Both functions are pure.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from enhydra import Aggregate, Rejection

OrderId = Annotated[str, msgspec.Meta(min_length=1)]
Sku = Annotated[str, msgspec.Meta(min_length=1)]
Positive = Annotated[int, msgspec.Meta(gt=0)]
Reason = Literal["out_of_stock", "payment_declined"]


# Commands
class Place(msgspec.Struct, tag="place"):
    order: OrderId
    sku: Sku
    quantity: Positive
    amount: Annotated[int, msgspec.Meta(gt=0, description="euros, a whole number above 0")]


class Confirm(msgspec.Struct, tag="confirm"):
    order: OrderId


class Reject(msgspec.Struct, tag="reject"):
    order: OrderId
    reason: Reason


class Cancel(msgspec.Struct, tag="cancel"):
    order: OrderId
    reason: str = "unpaid"


Command = Place | Confirm | Reject | Cancel


# Events: each carries what a service downstream needs, so none has to ask orders back.
class Placed(msgspec.Struct, tag="placed"):
    sku: str
    quantity: int
    amount: int


class Confirmed(msgspec.Struct, tag="confirmed"):
    pass


class Rejected(msgspec.Struct, tag="rejected"):
    reason: Reason
    sku: str
    quantity: int


class Cancelled(msgspec.Struct, tag="cancelled"):
    reason: str
    sku: str
    quantity: int


Event = Placed | Confirmed | Rejected | Cancelled


class Order(msgspec.Struct):
    status: Literal["pending", "confirmed", "rejected", "cancelled"]
    sku: str
    quantity: int
    amount: int
    reason: str = ""  # why it was rejected or cancelled


def decide(state: Order | None, command: Command) -> list[Event]:
    if isinstance(command, Place):
        if state is not None:
            raise Rejection("order already placed")
        return [Placed(command.sku, command.quantity, command.amount)]
    if state is None:
        raise Rejection("no such order")
    if state.status != "pending":
        raise Rejection(f"order is {state.status}")
    match command:
        case Confirm():
            return [Confirmed()]
        case Reject(reason=reason):
            return [Rejected(reason, state.sku, state.quantity)]
        case Cancel(reason=reason):
            return [Cancelled(reason, state.sku, state.quantity)]
    raise ValueError(f"unknown command {command!r}")


def apply(state: Order | None, event: Event) -> Order:
    match event:
        case Placed(sku=sku, quantity=quantity, amount=amount):
            return Order("pending", sku, quantity, amount)
    assert state is not None, f"{type(event).__name__} before placed"
    match event:
        case Confirmed():
            return msgspec.structs.replace(state, status="confirmed")
        case Rejected(reason=reason):
            return msgspec.structs.replace(state, status="rejected", reason=reason)
        case Cancelled(reason=reason):
            return msgspec.structs.replace(state, status="cancelled", reason=reason)
    raise ValueError(f"unknown event {event!r}")


orders = Aggregate(
    name="orders",
    decide=decide,
    apply=apply,
    command_types=(Place, Confirm, Reject, Cancel),
    event_types=(Placed, Confirmed, Rejected, Cancelled),
    state_type=Order,
    description="Orders: placed, then confirmed, rejected or cancelled once.",
)
