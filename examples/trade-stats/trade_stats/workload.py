"""A reproducible stream of trades with out-of-order and late ones, and an independent model.

The model is written plainly, without enhydra.windows, so a bug in the windowing cannot hide by
agreeing with itself: every 1 s boundary, a 5 s window, 2 s of grace, 60 s of retention.
"""

from __future__ import annotations

import random
from typing import Any

SYMBOLS = ("AAPL", "MSFT", "GOOG", "AMZN", "NFLX", "TSLA")
SIZE, ADVANCE, GRACE, RETENTION = 5_000, 1_000, 2_000, 60_000


def generate(
    count: int, *, seed: int = 3, start_ms: int = 1_700_000_000_000
) -> list[tuple[str, dict]]:
    """Trades about every 40 ms per symbol; 10% up to 1.9 s late (within grace), 4% 3-9 s late."""
    rng = random.Random(seed)
    clock = start_ms
    out: list[tuple[str, dict[str, Any]]] = []
    for n in range(count):
        clock += rng.randint(0, 80)
        roll = rng.random()
        if roll < 0.04:
            ts = clock - rng.randint(3_000, 9_000)  # beyond grace for most of its windows
        elif roll < 0.14:
            ts = clock - rng.randint(1, 1_900)  # out of order, within grace
        else:
            ts = clock
        symbol = rng.choice(SYMBOLS)
        trade = {
            "command_id": f"t{seed}-{n}",
            "type": "trade",
            "symbol": symbol,
            "price": round(rng.uniform(90, 110), 2),
            "shares": rng.randint(1, 500),
            "ts": ts,
        }
        out.append((symbol, trade))
    return out


def model(trades: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """(state per symbol, ids of rejected late trades), by the rules written out plainly."""
    states: dict[str, Any] = {}
    rejected: list[str] = []
    for symbol, trade in trades:
        ts = trade["ts"]
        state = states.get(symbol)
        stream_time = ts if state is None else max(ts, state["stream_time"])
        open_starts = []
        start = ts - ts % ADVANCE
        while start > ts - SIZE and start >= 0:
            if stream_time < start + SIZE + GRACE:
                open_starts.append(start)
            start -= ADVANCE
        if not open_starts:
            rejected.append(trade["command_id"])
            continue
        windows = dict(state["windows"]) if state else {}
        for start in sorted(open_starts):
            w = windows.get(str(start))
            if w is None:
                w = {"start": start, "end": start + SIZE, "trades": 0, "shares": 0, "sum": 0}
                w["min"] = w["max"] = trade["price"]
            w = dict(w)
            w["trades"] += 1
            w["shares"] += trade["shares"]
            w["sum"] += trade["price"]
            w["avg"] = w["sum"] / w["trades"]
            w["min"] = min(w["min"], trade["price"])
            w["max"] = max(w["max"], trade["price"])
            windows[str(start)] = w
        windows = {k: w for k, w in windows.items() if w["start"] + RETENTION > stream_time}
        states[symbol] = {"stream_time": stream_time, "windows": windows}
    return states, rejected
