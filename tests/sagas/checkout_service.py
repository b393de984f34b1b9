"""A service for the sagas' tests: orders, and a checkout saga that cancels unpaid ones.

Orders are placed and paid through the service's own commands; the saga reads the service's
own events (re-keyed by order id into its inbox) and a `payments` service's events when
CHECKOUT_PAYMENTS names one. On `placed` it schedules the deadline `unpaid`, whose command
cancels the order; `paid` cancels the deadline; `cancelled` ends the saga. The aggregate
counts every cancel it accepts, so a deadline fired twice with two ids would show up as
`cancels: 2`, while a copy with the same id is skipped by the aggregate's dedup.
CHECKOUT_UNPAID_S is the deadline (seconds).
"""

from __future__ import annotations

import os
from typing import Any

from enhydra import Aggregate, Service
from enhydra.sagas import Cancel, Deadline, Emit, Saga, Upstream

UNPAID_S = float(os.environ.get("CHECKOUT_UNPAID_S", "900"))


def decide(state: dict[str, Any] | None, command: dict[str, Any]) -> list[dict[str, Any]]:
    kind = command["type"]
    if kind == "place":
        return [{"type": "placed", "order": command["order"], "amount": command["amount"]}]
    if kind == "pay":
        return [{"type": "paid", "order": command["order"]}]
    if kind == "cancel":
        return [{"type": "cancelled", "order": command["order"]}]
    raise ValueError(f"unknown command {kind!r}")


def apply(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    state = dict(state or {"status": "new", "cancels": 0})
    if event["type"] == "placed":
        state["status"] = "placed"
    elif event["type"] == "paid":
        state["status"] = "paid"
    elif event["type"] == "cancelled":
        state["status"] = "cancelled"
        state["cancels"] += 1
    return state


def order_of(upstream: Upstream) -> str | None:
    return upstream.event.get("order")


def checkout(state: dict[str, Any] | None, upstream: Upstream):
    kind = upstream.event["type"]
    order = upstream.event["order"]
    if kind == "placed":
        if state and state.get("paid"):  # the payment's event came first (another topic)
            return {**state, "placed": True}, [], []
        cancel = Emit(order, {"type": "cancel", "order": order})
        return {"placed": True}, [], [Deadline("unpaid", UNPAID_S, cancel)]
    if kind in ("paid", "captured"):
        return {**(state or {}), "paid": True}, [], [Cancel("unpaid")]
    if kind == "cancelled":
        return None, [], []  # the saga ends
    return state, [], []


def checkout_saga(app_id: str, payments: str | None = None) -> Saga:
    sources = [app_id, payments] if payments else [app_id]
    return Saga("checkout", sources, order_of, checkout)


APP = os.environ.get("ENHYDRA_APP_ID", "shop")
service = Service(
    APP,
    Aggregate("orders", decide, apply),
    sagas=[checkout_saga(APP, os.environ.get("CHECKOUT_PAYMENTS"))],
)
