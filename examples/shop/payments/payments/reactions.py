"""What payments does with stock's events: a reservation asks for the order's payment.

The upstream type below is this service's side of the contract (contracts/stock.json holds
stock's own): only the fields read here are declared.
"""

from __future__ import annotations

import msgspec
from enhydra.reactions import Emit, Reaction, Upstream

from payments.domain import Request
from payments.upstreams import app_id


class Reserved(msgspec.Struct, tag="reserved"):
    order: str
    amount: int


def on_reserved(upstream: Upstream) -> list[Emit]:
    """Stock is keyed by sku; payments by order id."""
    order = upstream.event.order
    return [Emit(order, Request(order, upstream.event.amount))]


def reactions() -> list[Reaction]:
    return [Reaction("stock", app_id("stock"), on_reserved, reads=[Reserved])]
