"""What orders does with stock's and payments' answers: each settles a pending order.

The upstream types below are this service's side of the contracts (contracts/stock.json and
contracts/payments.json hold the upstreams' own): only the fields read here are declared.
"""

from __future__ import annotations

import msgspec
from enhydra.reactions import Emit, Reaction, Upstream

from orders.domain import Confirm, Reject
from orders.upstreams import app_id


class OutOfStock(msgspec.Struct, tag="out_of_stock"):
    order: str


class Captured(msgspec.Struct, tag="captured"):
    pass


class Declined(msgspec.Struct, tag="declined"):
    pass


def on_stock(upstream: Upstream) -> list[Emit]:
    """Stock could not reserve the order's items: the order is rejected."""
    order = upstream.event.order
    return [Emit(order, Reject(order, "out_of_stock"))]


def on_payment(upstream: Upstream) -> list[Emit]:
    """Payments are keyed by order id: captured confirms the order, declined rejects it."""
    order = upstream.key or ""
    if isinstance(upstream.event, Captured):
        return [Emit(order, Confirm(order))]
    return [Emit(order, Reject(order, "payment_declined"))]


def reactions() -> list[Reaction]:
    return [
        Reaction("stock", app_id("stock"), on_stock, reads=[OutOfStock]),
        Reaction("payments", app_id("payments"), on_payment, reads=[Captured, Declined]),
    ]
