"""fold_input: the one place a fold takes an event's headers apart (backfill and time travel)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from enhydra.contracts.fold_input import (
    FOLD_COLUMNS,
    FoldInputError,
    fold_input,
    kafka_events_batch,
)
from enhydra.contracts.headers import event_headers

RECORDS = [
    (b"a", 0, 0, b"{}", event_headers(b"c1", 5, 0)),
    (b"a", 0, 1, b"{}", []),  # an event some other producer wrote: no headers
    (
        b"b",
        1,
        2,
        b"{}",
        [("x", b"y"), ("enhydra.command_offset", b"7"), ("enhydra.command_offset", b"8")],
    ),
    (b"c", 1, 3, b"{}", event_headers(b"c2", 9, 3)),
]


def test_headers_become_the_fold_columns_missing_ones_null_the_first_value_wins() -> None:
    rows = fold_input(kafka_events_batch(RECORDS)).to_pylist()
    assert list(rows[0]) == list(FOLD_COLUMNS)
    assert [(r["command_id"], r["command_offset"], r["index"]) for r in rows] == [
        (b"c1", b"5", b"0"),
        (None, None, None),
        (None, b"7", None),
        (b"c2", b"9", b"3"),
    ]
    assert [r["key"] for r in rows] == [b"a", b"a", b"b", b"c"]
    assert all(r["fold_order"] is None for r in rows)


def test_a_slice_reads_its_own_rows_headers() -> None:
    rows = fold_input(kafka_events_batch(RECORDS).slice(2, 2)).to_pylist()
    assert [(r["offset"], r["command_offset"], r["index"]) for r in rows] == [
        (2, b"7", None),
        (3, b"9", b"3"),
    ]
    assert fold_input(kafka_events_batch(RECORDS).slice(0, 0)).num_rows == 0


def test_a_batch_without_headers_is_refused_by_name() -> None:
    batch = pa.RecordBatch.from_pydict({"key": [b"a"], "value": [b"{}"]})
    with pytest.raises(FoldInputError, match="partition, offset, headers"):
        fold_input(batch)
