"""What stock does with orders' events: reserve for a placed order, release for a rejected
(payment declined) or cancelled (unpaid) one.

The upstream types below are this service's side of the contract (contracts/orders.json holds
orders' own): only the fields read here are declared.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from enhydra.reactions import Emit, Reaction, Upstream

from stock.domain import Release, Reserve
from stock.upstreams import app_id


class OrderPlaced(msgspec.Struct, tag="placed"):
    sku: str
    quantity: int
    amount: int


class OrderRejected(msgspec.Struct, tag="rejected"):
    reason: Literal["out_of_stock", "payment_declined"]
    sku: str
    quantity: int


class OrderCancelled(msgspec.Struct, tag="cancelled"):
    sku: str
    quantity: int


def on_order(upstream: Upstream) -> list[Emit]:
    """Orders are keyed by order id; stock is keyed by sku."""
    order, event = upstream.key or "", upstream.event
    if isinstance(event, OrderPlaced):
        return [Emit(event.sku, Reserve(event.sku, order, event.quantity, event.amount))]
    if isinstance(event, OrderCancelled):  # unpaid in time: its items were reserved
        return [Emit(event.sku, Release(event.sku, order, event.quantity))]
    if event.reason == "payment_declined":  # only then were its items reserved
        return [Emit(event.sku, Release(event.sku, order, event.quantity))]
    return []


def reactions() -> list[Reaction]:
    return [
        Reaction(
            "orders", app_id("orders"), on_order, reads=[OrderPlaced, OrderRejected, OrderCancelled]
        )
    ]
