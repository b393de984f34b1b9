"""Stock trade statistics, the example of the Kafka Streams talk, as an Enhydra aggregate.

A trade is a command keyed by its symbol:

    {"command_id": str, "type": "trade", "symbol": str, "price": number > 0,
     "shares": int > 0, "ts": epoch milliseconds of the trade (event time)}

The state of a symbol is its statistics in hopping windows of 5 s advancing every 1 s, by the
trade's own timestamp rather than arrival time. Trades may arrive out of order: a trade still
counts in every window of it that is open, i.e. whose end plus the 2 s grace period is after
the symbol's stream time (the latest trade time seen). A trade for which every window has
closed is rejected as late, so it is visible on the rejections topic and never silently lost.
Windows are kept for RETENTION_MS after they start, then dropped.

    {"stream_time": ms,
     "windows": {"<start ms>": {"start": ms, "end": ms, "trades": n, "shares": n,
                                "sum": total price, "avg": average price,
                                "min": price, "max": price}}}
"""

from __future__ import annotations

from typing import Any

from enhydra import Aggregate, InvalidCommand, Rejection
from enhydra.windows import HoppingWindows

WINDOWS = HoppingWindows(size_ms=5_000, advance_ms=1_000, grace_ms=2_000)
RETENTION_MS = 60_000

State = dict[str, Any]


def parse(command: dict[str, Any]) -> dict[str, Any]:
    """A trade's shape; a malformed trade is a sender's bug (dead-letter queue)."""
    if command.get("type") != "trade":
        raise InvalidCommand(f"unknown command type {command.get('type')!r}; expected 'trade'")
    symbol = command.get("symbol")
    if not isinstance(symbol, str) or not symbol:
        raise InvalidCommand("symbol must be a non-empty string")
    price = command.get("price")
    if isinstance(price, bool) or not isinstance(price, int | float) or price <= 0:
        raise InvalidCommand(f"price must be a number greater than 0, got {price!r}")
    for name in ("shares", "ts"):
        value = command.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < (name == "shares"):
            raise InvalidCommand(f"{name} must be a whole number (ms for ts), got {value!r}")
    return command


def decide(state: State | None, command: dict[str, Any]) -> list[dict[str, Any]]:
    """Accept a trade unless every window it belongs to has closed."""
    ts = command["ts"]
    stream_time = max(ts, state["stream_time"]) if state else ts
    if not WINDOWS.open_starts(ts, stream_time):
        behind = stream_time - ts
        raise Rejection(
            f"late trade: {behind} ms behind stream time, grace is {WINDOWS.grace_ms} ms"
        )
    return [{"type": "traded", "price": command["price"], "shares": command["shares"], "ts": ts}]


def apply(state: State | None, event: dict[str, Any]) -> State:
    """Fold a trade into its open windows, then drop windows past retention."""
    ts, price = event["ts"], event["price"]
    stream_time = max(ts, state["stream_time"]) if state else ts
    windows = dict(state["windows"]) if state else {}
    for start in WINDOWS.open_starts(ts, stream_time):
        key = str(start)
        old = windows.get(key)
        if old is None:
            old = {"start": start, "end": WINDOWS.end(start), "trades": 0, "shares": 0, "sum": 0}
            old |= {"min": price, "max": price}
        total = old["sum"] + price
        trades = old["trades"] + 1
        windows[key] = {
            **old,
            "trades": trades,
            "shares": old["shares"] + event["shares"],
            "sum": total,
            "avg": total / trades,
            "min": min(old["min"], price),
            "max": max(old["max"], price),
        }
    kept = {k: w for k, w in windows.items() if w["start"] + RETENTION_MS > stream_time}
    return {"stream_time": stream_time, "windows": kept}


trades = Aggregate(
    name="trade-stats",
    decide=decide,
    apply=apply,
    parse=parse,
    description="Per symbol: trades, shares and average price in 5 s windows every 1 s.",
)
