"""trade-stats against its model, in memory: out-of-order trades count, late ones are rejected."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trade_stats.domain import WINDOWS, trades
from trade_stats.service import service
from trade_stats.workload import generate, model

from enhydra.testing import Driver
from enhydra.windows import HoppingWindows


def trade(command_id: str, ts: int, price: float = 100.0, shares: int = 1) -> dict:
    return {
        "command_id": command_id,
        "type": "trade",
        "symbol": "AAPL",
        "price": price,
        "shares": shares,
        "ts": ts,
    }


@given(st.integers(0, 10**13), st.integers(1, 20), st.integers(1, 20), st.integers(0, 5_000))
def test_a_timestamp_is_in_size_over_advance_windows(
    ts: int, advance_s: int, extra: int, grace: int
) -> None:
    spec = HoppingWindows((advance_s * extra) * 1000, advance_s * 1000, grace)
    starts = spec.starts(ts)
    assert all(s <= ts < s + spec.size_ms and s % spec.advance_ms == 0 for s in starts)
    assert len(starts) == (extra if ts >= spec.size_ms else ts // spec.advance_ms + 1)


def test_windows_close_at_end_plus_grace() -> None:
    spec = HoppingWindows(5_000, 1_000, 2_000)
    assert spec.starts(12_345) == [8_000, 9_000, 10_000, 11_000, 12_000]
    assert spec.open_starts(12_345, 12_345 + 2_000) == spec.starts(12_345)
    assert spec.open_starts(9_000, 15_000) == [5_000, 6_000, 7_000, 8_000, 9_000][-1:] == [9_000]
    assert spec.is_closed(8_000, 15_000) and not spec.is_closed(8_000, 14_999)
    with pytest.raises(ValueError, match="advance=6000"):
        HoppingWindows(5_000, 6_000)


def test_out_of_order_trade_within_grace_counts_and_late_one_is_rejected() -> None:
    driver = Driver(service)
    base = 1_700_000_000_000
    assert driver.send("AAPL", trade("a", base + 10_500, 10.0)).accepted
    in_grace = driver.send("AAPL", trade("b", base + 6_000, 20.0))  # window [6..11) still open
    assert in_grace.accepted
    late = driver.send("AAPL", trade("c", base + 3_000, 30.0))  # [0..5) .. [3..8) all closed
    assert late.rejection == "late trade: 7500 ms behind stream time, grace is 2000 ms"
    windows = driver.state("AAPL")["windows"]
    shared = windows[str(base + 6_000)]
    assert (shared["trades"], shared["avg"], shared["min"], shared["max"]) == (2, 15.0, 10.0, 20.0)
    assert windows[str(base + 10_000)]["trades"] == 1
    assert str(base + 2_000) not in windows  # trade b's closed windows were not opened


def test_a_stream_with_late_and_out_of_order_trades_matches_the_model() -> None:
    stream = generate(4_000, seed=11)
    driver = Driver(trades)
    for start in range(0, len(stream), 250):  # batches, as the engine fetches them
        driver.send_many(stream[start : start + 250])
    expected, late = model(stream)
    assert {s: driver.state(s) for s in driver.stored_keys()} == expected
    assert [r["command_id"] for r in driver.rejections] == late
    assert 50 < len(late) < 400
    assert all(r["reason"].startswith("late trade") for r in driver.rejections)
    out_of_order = sum(1 for (_, a), (_, b) in itertools.pairwise(stream) if b["ts"] < a["ts"])
    assert out_of_order > 300


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("price", 0, "price must be a number greater than 0"),
        ("price", "1", "price must be a number greater than 0"),
        ("shares", 0, "shares must be a whole number"),
        ("ts", 1.5, "ts must be a whole number"),
        ("type", "quote", "unknown command type 'quote'"),
    ],
)
def test_malformed_trades_are_failures_not_rejections(
    field: str, value: object, reason: str
) -> None:
    outcome = Driver(service).send("AAPL", {**trade("x", 1_000), field: value})
    assert outcome.failure is not None and reason in str(outcome.failure.error)


def test_windows_spec_is_the_talks() -> None:
    assert (WINDOWS.size_ms, WINDOWS.advance_ms, WINDOWS.grace_ms) == (5_000, 1_000, 2_000)
