"""What a fold of the events topic reads from each event: one definition for every path.

The Spark backfill and time travel (`enhydra snapshot at`, which folds in process) rebuild
state by folding events through `apply`, and both need the same headers as columns: three to
skip redelivered duplicates exactly (see spark/fold.py), and the event's version to upcast it
before `apply` (evolution.py). They once extracted them separately
and drifted: time travel dropped `enhydra.event_index` and applied a duplicate twice that the
backfill folded once. Now both hand Kafka-shaped batches (key, partition, offset, value,
headers) to `fold_input` and folds what it returns.

Pure pyarrow and vectorized (no per-row Python): Spark executors run it on every batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from enhydra.contracts.headers import (
    COMMAND_ID_HEADER,
    COMMAND_OFFSET_HEADER,
    EVENT_INDEX_HEADER,
    EVENT_VERSION_HEADER,
)

# fold column -> the header it is read from
HEADER_COLUMNS = {
    "command_id": COMMAND_ID_HEADER,
    "command_offset": COMMAND_OFFSET_HEADER,
    "index": EVENT_INDEX_HEADER,
    "version": EVENT_VERSION_HEADER,
}
# What the fold reads, in order. fold_order is the rows' sort position when they are not
# sorted by the key itself (Spark sorts by a hash of the key first); null means by key.
FOLD_COLUMNS = ("key", "partition", "offset", "value", *HEADER_COLUMNS, "fold_order")

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# Events as the Kafka readers hand them over, reduced to what a fold needs.
KAFKA_EVENTS_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.binary()),
        ("headers", HEADERS_TYPE),
    ]
)


class FoldInputError(ValueError):
    """The batch is not shaped like Kafka events."""


def fold_input(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka-shaped events -> the fold's columns (FOLD_COLUMNS), headers as raw bytes.

    A header missing on an event gives null (events written by something other than the
    engine); a header given twice counts with its first value, as Kafka clients read it.
    """
    names = batch.schema.names
    missing = [n for n in ("key", "partition", "offset", "value", "headers") if n not in names]
    if missing:
        raise FoldInputError(f"fold input lacks column(s) {', '.join(missing)}")
    n = batch.num_rows
    headers = batch.column("headers")
    columns = {name: batch.column(name) for name in ("key", "partition", "offset", "value")}
    columns.update(_header_columns(headers, n))
    columns["fold_order"] = (
        batch.column("fold_order") if "fold_order" in names else pa.nulls(n, pa.int64())
    )
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(FOLD_COLUMNS))


def _header_columns(headers: pa.Array, n: int) -> dict[str, pa.Array]:
    """Each of HEADER_COLUMNS as a column; the headers are taken apart once for all of them."""
    if n == 0 or headers.null_count == n:
        return {column: pa.nulls(n, pa.binary()) for column in HEADER_COLUMNS}
    keys, values = headers.flatten().flatten()  # slice-aware (StructArray.field is not)
    parents = pc.list_parent_indices(headers)
    row_ids = pa.array(range(n), pa.int64())
    return {
        column: _first_header(keys, values, parents, row_ids, name)
        for column, name in HEADER_COLUMNS.items()
    }


def _first_header(
    keys: pa.Array, values: pa.Array, parents: pa.Array, row_ids: pa.Array, name: str
) -> pa.Array:
    """Per row, the first value of header `name` (null where it has none)."""
    n = len(row_ids)
    hit = pc.equal(keys, name)
    rows = pc.filter(parents, hit)
    if len(rows) == 0:
        return pa.nulls(n, pa.binary())
    found = pc.filter(values, hit)
    if len(rows) > 1:  # keep each row's first hit (rows ascend, so repeats are adjacent)
        first = pc.not_equal(rows.slice(1), rows.slice(0, len(rows) - 1))
        keep = pa.concat_arrays([pa.array([True]), first])
        rows, found = pc.filter(rows, keep), pc.filter(found, keep)
    present = pc.is_in(row_ids, value_set=rows.cast(pa.int64()))
    return pc.replace_with_mask(pa.nulls(n, pa.binary()), present, found.cast(pa.binary()))


def kafka_events_batch(
    records: Sequence[tuple[bytes | None, int, int, bytes | None, Iterable[tuple[str, bytes]]]],
) -> pa.RecordBatch:
    """(key, partition, offset, value, headers) tuples, e.g. read with aiokafka, as a batch."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r[0] for r in records], pa.binary()),
            pa.array([r[1] for r in records], pa.int32()),
            pa.array([r[2] for r in records], pa.int64()),
            pa.array([r[3] for r in records], pa.binary()),
            pa.array(
                [[{"key": k, "value": v} for k, v in r[4]] or None for r in records],
                HEADERS_TYPE,
            ),
        ],
        schema=KAFKA_EVENTS_SCHEMA,
    )
