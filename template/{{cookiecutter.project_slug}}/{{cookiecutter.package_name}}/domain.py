"""Stock items: registered once, then received into and shipped out of stock.

Commands are JSON objects keyed by item id:

    {"command_id": str, "type": "register" | "receive" | "ship", "item": str, "quantity": int}

`quantity` is needed by receive (more than 0) and ship (more than 0, at most what is on hand).
State per item: {"on_hand": int, "version": int}, where version counts the events applied.

Both functions are pure: the streaming service, the test driver and a PySpark backfill run
exactly this code, so keep I/O, clocks and randomness out of them. Replace this example with
your own domain; the shape (decide raises Rejection, apply folds events) stays.
"""

from __future__ import annotations

from typing import Any

from enhydra import Aggregate, Rejection

Command = dict[str, Any]
Event = dict[str, Any]
State = dict[str, Any]

COMMAND_TYPES = ("register", "receive", "ship")


def _quantity(command: Command) -> int:
    quantity = command.get("quantity")
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise Rejection(f"quantity must be a whole number, got {quantity!r}")
    if quantity <= 0:
        raise Rejection(f"quantity must be greater than 0, got {quantity}")
    return quantity


def decide(state: State | None, command: Command) -> list[Event]:
    """Check a command against the item and say what happened (or raise Rejection)."""
    kind = command.get("type")
    if kind not in COMMAND_TYPES:
        expected = ", ".join(COMMAND_TYPES)
        raise Rejection(f"unknown command type {kind!r}; expected one of {expected}")
    item = command.get("item")
    if not isinstance(item, str) or not item:
        raise Rejection("item must be a non-empty string")
    if kind == "register":
        if state is not None:
            raise Rejection(f"item {item!r} is already registered")
        return [{"type": "registered", "item": item}]
    if state is None:
        raise Rejection(f"item {item!r} is not registered")
    quantity = _quantity(command)
    if kind == "receive":
        return [{"type": "received", "quantity": quantity}]
    if quantity > state["on_hand"]:
        raise Rejection(f"cannot ship {quantity} of {item!r}: only {state['on_hand']} on hand")
    return [{"type": "shipped", "quantity": quantity}]


def apply(state: State | None, event: Event) -> State:
    """The only way an item's state changes; never raises for events decide produced."""
    kind = event["type"]
    if kind == "registered":
        return {"on_hand": 0, "version": 1}
    if state is None:
        raise ValueError(f"{kind!r} event for an item that was never registered")
    if kind == "received":
        on_hand = state["on_hand"] + event["quantity"]
    elif kind == "shipped":
        on_hand = state["on_hand"] - event["quantity"]
    else:
        raise ValueError(f"unknown event type {kind!r}")
    return {"on_hand": on_hand, "version": state["version"] + 1}


items = Aggregate(
    name="items",
    decide=decide,
    apply=apply,
    description="Stock items: quantity on hand and the number of events applied.",
)
