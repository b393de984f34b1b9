"""Stock items: registered once, then received into and shipped out of stock.

Commands are JSON objects keyed by item id:

    {"command_id": str, "type": "register" | "receive" | "ship", "item": str, "quantity": int}

`quantity` is needed by receive (more than 0) and ship (more than 0, at most what is on hand).
State per item: {"on_hand": int, "version": int}, where version counts the events applied.

Both functions are pure: the streaming service, the test driver and a PySpark backfill run
exactly this code, so keep I/O, clocks and randomness out of them. Replace this example with
your own domain; the shape (parse checks the shape, decide raises Rejection, apply folds
events) stays.
"""

from __future__ import annotations

from typing import Any

from enhydra import Aggregate, InvalidCommand, Rejection

Command = dict[str, Any]
Event = dict[str, Any]
State = dict[str, Any]

COMMAND_TYPES = ("register", "receive", "ship")


def parse(command: Command) -> Command:
    """The command's shape: a known type, an item, a positive whole quantity where needed.

    A malformed command is the sender's bug, not a business answer: raising InvalidCommand
    sends it to the dead-letter queue (with the template's settings) instead of publishing a
    rejection. decide below only ever sees well-formed commands.
    """
    kind = command.get("type")
    if kind not in COMMAND_TYPES:
        expected = ", ".join(COMMAND_TYPES)
        raise InvalidCommand(f"unknown command type {kind!r}; expected one of {expected}")
    item = command.get("item")
    if not isinstance(item, str) or not item:
        raise InvalidCommand("item must be a non-empty string")
    if kind in ("receive", "ship"):
        quantity = command.get("quantity")
        if isinstance(quantity, bool) or not isinstance(quantity, int):
            raise InvalidCommand(f"quantity must be a whole number, got {quantity!r}")
        if quantity <= 0:
            raise InvalidCommand(f"quantity must be greater than 0, got {quantity}")
    return command


def decide(state: State | None, command: Command) -> list[Event]:
    """Check a well-formed command against the item and say what happened (or reject it)."""
    kind, item = command["type"], command["item"]
    if kind == "register":
        if state is not None:
            raise Rejection(f"item {item!r} is already registered")
        return [{"type": "registered", "item": item}]
    if state is None:
        raise Rejection(f"item {item!r} is not registered")
    quantity = command["quantity"]
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
    parse=parse,
    description="Stock items: quantity on hand and the number of events applied.",
)
