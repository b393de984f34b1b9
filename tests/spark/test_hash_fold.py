"""The hash fold in Spark: rows in log order, no sort, and a refusal when that order is broken.

The events are built as the readers hand them over (the read_events schema), one Spark
partition per Kafka partition, so these run on the session's real Spark without a broker; the
parity tests (test_parity.py) fold a real topic both ways.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.headers import COMMAND_ID_HEADER, COMMAND_OFFSET_HEADER
from enhydra.spark.fold import FoldError, fold_events
from enhydra.spark.source import SCHEMA_DDL

TARGET = "ledger.domain:accounts"
AT = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def event(partition: int, offset: int, key: str, body: dict[str, Any]) -> tuple[Any, ...]:
    headers = [
        {"key": COMMAND_ID_HEADER, "value": f"c{partition}-{offset}".encode()},
        {"key": COMMAND_OFFSET_HEADER, "value": str(offset).encode()},
    ]
    return (key.encode(), orjson.dumps(body), "t", partition, offset, AT, headers)


def log(partition: int, accounts: int, rounds: int) -> list[tuple[Any, ...]]:
    """Interleaved accounts of one partition, each opened then deposited into, offset order."""
    rows, offset = [], 0
    for r in range(rounds):
        for a in range(accounts):
            key = f"p{partition}-acct-{a:03d}"
            body = {"type": "opened"} if r == 0 else {"type": "deposited", "amount": r}
            rows.append(event(partition, offset, key, body))
            offset += 1
    return rows


def as_spark(spark: Any, partitions: list[list[tuple[Any, ...]]]) -> Any:
    """One Spark partition per Kafka partition, each in the given row order."""
    rdd = spark.sparkContext.parallelize(partitions, len(partitions)).flatMap(lambda rows: rows)
    return spark.createDataFrame(rdd, SCHEMA_DDL)


def entries(folded: Any) -> dict[bytes, tuple[Any, ...]]:
    rows = folded.collect()
    out = {r.key: (decode_entry(r.value), r.partition, r.events, r.last_offset) for r in rows}
    assert len(out) == len(rows)
    return out


@pytest.mark.spark
def test_hash_and_sort_folds_give_the_same_rows_in_spark(spark) -> None:
    events = as_spark(spark, [log(0, 40, 6), log(1, 25, 9)])
    hashed = fold_events(events, TARGET, shuffle=False, fold="hash")
    plan = hashed._jdf.queryExecution().executedPlan().toString()
    assert "Sort [" not in plan and "Exchange" not in plan, plan
    by_hash, by_sort = entries(hashed), entries(fold_events(events, TARGET, shuffle=False))
    assert by_hash == by_sort
    assert len(by_hash) == 65
    opened = decode_entry(next(r.value for r in hashed.collect() if r.key == b"p1-acct-000"))
    assert opened.state["balance"] == sum(range(1, 9))


@pytest.mark.spark
def test_a_partition_whose_offsets_go_backwards_is_refused_by_the_hash_fold(spark) -> None:
    rows = log(0, 3, 3)
    rows[4], rows[7] = rows[7], rows[4]  # offsets 0 1 2 3 7 5 6 4 8
    events = as_spark(spark, [rows])
    with pytest.raises(
        Exception, match=r"FoldError: key b'p0-acct-002' at partition 0 offset 5"
    ) as e:
        fold_events(events, TARGET, shuffle=False, fold="hash").collect()
    assert "it comes after offset 7 of partition 0" in str(e.value)
    assert "rerun with --fold sort" in str(e.value)
    # the sort fold orders each key's events itself: the state of the ordered log
    by_sort = entries(fold_events(events, TARGET, shuffle=False, fold="sort"))
    assert by_sort == entries(fold_events(as_spark(spark, [log(0, 3, 3)]), TARGET, shuffle=False))


def test_the_hash_fold_needs_the_partitions_in_place() -> None:
    with pytest.raises(FoldError, match="needs whole Kafka partitions in place"):
        fold_events(None, TARGET, shuffle=True, fold="hash")
    with pytest.raises(FoldError, match="fold 'quick': expected one of hash, sort"):
        fold_events(None, TARGET, shuffle=False, fold="quick")
