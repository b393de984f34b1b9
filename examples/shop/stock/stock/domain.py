"""Stock: how many of each item are available, and how many are held for orders.

Commands (JSON, keyed by sku; "type" picks the Struct):
    restock  {sku, quantity}                  items arrive (from outside)
    reserve  {sku, order, quantity, amount}   an order was placed (reaction `orders`)
    release  {sku, order, quantity}           a reserved order was rejected or cancelled
                                              (reaction `orders`)

A reserve either holds the items (`reserved`, which payments answers) or says `out_of_stock`
(which orders answers): both are events, so the other services can react to either. A sku
never restocked has nothing available. `amount` only passes through: payments reads it from
`reserved`. Both functions are pure.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from enhydra import Aggregate, Rejection

Sku = Annotated[str, msgspec.Meta(min_length=1)]
OrderId = Annotated[str, msgspec.Meta(min_length=1)]
Positive = Annotated[int, msgspec.Meta(gt=0)]


# Commands
class Restock(msgspec.Struct, tag="restock"):
    sku: Sku
    quantity: Positive


class Reserve(msgspec.Struct, tag="reserve"):
    sku: Sku
    order: OrderId
    quantity: Positive
    amount: Positive


class Release(msgspec.Struct, tag="release"):
    sku: Sku
    order: OrderId
    quantity: Positive


Command = Restock | Reserve | Release


# Events
class Restocked(msgspec.Struct, tag="restocked"):
    quantity: int


class Reserved(msgspec.Struct, tag="reserved"):
    order: str
    quantity: int
    amount: int


class OutOfStock(msgspec.Struct, tag="out_of_stock"):
    order: str
    quantity: int
    available: int


class Released(msgspec.Struct, tag="released"):
    order: str
    quantity: int


Event = Restocked | Reserved | OutOfStock | Released


class Item(msgspec.Struct):
    available: int
    reserved: int  # held for orders (sold, once their payment is captured)
    refused: int = 0  # reserves answered with out_of_stock


EMPTY = Item(0, 0)


def decide(state: Item | None, command: Command) -> list[Event]:
    item = state or EMPTY
    match command:
        case Restock(quantity=quantity):
            return [Restocked(quantity)]
        case Reserve(order=order, quantity=quantity, amount=amount):
            if quantity > item.available:
                return [OutOfStock(order, quantity, item.available)]
            return [Reserved(order, quantity, amount)]
        case Release(order=order, quantity=quantity):
            if quantity > item.reserved:
                raise Rejection(f"cannot release {quantity}: {item.reserved} reserved")
            return [Released(order, quantity)]
    raise ValueError(f"unknown command {command!r}")


def apply(state: Item | None, event: Event) -> Item:
    item = state or EMPTY
    match event:
        case Restocked(quantity=quantity):
            return Item(item.available + quantity, item.reserved, item.refused)
        case Reserved(quantity=quantity):
            return Item(item.available - quantity, item.reserved + quantity, item.refused)
        case OutOfStock():
            return Item(item.available, item.reserved, item.refused + 1)
        case Released(quantity=quantity):
            return Item(item.available + quantity, item.reserved - quantity, item.refused)
    raise ValueError(f"unknown event {event!r}")


items = Aggregate(
    name="items",
    decide=decide,
    apply=apply,
    command_types=(Restock, Reserve, Release),
    event_types=(Restocked, Reserved, OutOfStock, Released),
    state_type=Item,
    description="Stock per sku: available, reserved for orders, reserves refused.",
)
