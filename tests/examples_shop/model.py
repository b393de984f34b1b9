"""A reproducible stream of shop orders, and the final state of every service, modelled.

The model is the shop's rules written out plainly and apart from the services' code, so a bug
in a decide, an apply or a reaction cannot hide by agreeing with itself. It holds only when
the outcome does not depend on the order in which stock sees the reserves (orders on one sku
interleave across partitions): a sku either has enough for every order on it, or too little
for any one of them. `generate` makes such a stream and `model` checks that it is one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

LIMIT = 1000  # payments declines a larger amount
AWAITING = 7  # payments leaves an amount ending in 7 (within the limit) unanswered
PLENTY = 5000  # restocked for a plentiful sku: more than every order on it together
SCARCE = 1  # restocked for a scarce sku: less than any order on it


@dataclass
class Shop:
    restocks: list[tuple[str, dict[str, Any]]]  # stock commands, sent before any order
    orders: list[tuple[str, dict[str, Any]]]  # orders commands: place, each order once
    stock: dict[str, int] = field(default_factory=dict)  # sku -> quantity restocked


def generate(count: int, *, skus: int = 12, seed: int = 28) -> Shop:
    """`count` orders over `skus` skus: most plentiful, two scarce, one never restocked."""
    rng = random.Random(seed)
    names = [f"sku-{i:02d}" for i in range(skus)]
    scarce, unknown = set(names[-3:-1]), names[-1]
    stock = {sku: (SCARCE if sku in scarce else PLENTY) for sku in names if sku != unknown}
    restocks = [
        (sku, {"command_id": f"restock-{sku}", "type": "restock", "sku": sku, "quantity": q})
        for sku, q in stock.items()
    ]
    orders = []
    for n in range(count):
        order, sku = f"order-{n:05d}", rng.choice(names)
        quantity = rng.randint(SCARCE + 1, 5)
        amount = rng.randint(1, LIMIT * 13 // 10)  # about 1 in 4 above, 1 in 13 unpaid
        place = {"type": "place", "order": order, "sku": sku, "quantity": quantity}
        orders.append((order, {"command_id": f"place-{order}", **place, "amount": amount}))
    return Shop(restocks, orders, stock)


@dataclass
class Expected:
    """Each service's state per key, and how many events each service publishes."""

    orders: dict[str, dict[str, Any]]
    stock: dict[str, dict[str, Any]]
    payments: dict[str, dict[str, Any]]
    events: dict[str, int]


def model(shop: Shop) -> Expected:
    """Where every order ends, and what stock and payments hold then.

    An order whose payment is never answered is cancelled by orders' checkout saga, once, and
    stock releases its items; the payment stays awaiting (the deadline is longer than any
    answer takes, so no answer comes after a cancel).
    """
    demand: dict[str, int] = {}
    for _, place in shop.orders:
        demand[place["sku"]] = demand.get(place["sku"], 0) + place["quantity"]
    for sku, wanted in demand.items():
        have = shop.stock.get(sku, 0)
        smallest = min(p["quantity"] for _, p in shop.orders if p["sku"] == sku)
        assert wanted <= have or smallest > have, f"{sku}: the outcome depends on the order"

    orders, payments = {}, {}
    stock = {sku: {"available": q, "reserved": 0, "refused": 0} for sku, q in shop.stock.items()}
    events = {"orders": 0, "stock": len(shop.restocks), "payments": 0}
    for order, place in shop.orders:
        sku, quantity, amount = place["sku"], place["quantity"], place["amount"]
        item = stock.setdefault(sku, {"available": 0, "reserved": 0, "refused": 0})
        events["orders"] += 2  # placed, then confirmed, rejected or cancelled
        events["stock"] += 1  # reserved or out_of_stock
        if quantity > item["available"]:
            item["refused"] += 1
            status, reason = "rejected", "out_of_stock"
        elif amount > LIMIT:
            payments[order] = {"status": "declined", "amount": amount}
            events["payments"] += 1
            events["stock"] += 1  # released
            status, reason = "rejected", "payment_declined"
        elif amount % 10 == AWAITING:
            payments[order] = {"status": "awaiting", "amount": amount}
            events["payments"] += 1
            events["stock"] += 1  # released
            status, reason = "cancelled", "unpaid"
        else:
            item["available"] -= quantity
            item["reserved"] += quantity
            payments[order] = {"status": "captured", "amount": amount}
            events["payments"] += 1
            status, reason = "confirmed", ""
        orders[order] = {
            "status": status,
            "sku": sku,
            "quantity": quantity,
            "amount": amount,
            "reason": reason,
        }
    return Expected(orders, stock, payments, events)
