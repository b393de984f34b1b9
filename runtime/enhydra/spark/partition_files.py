"""On executors: write a snapshot's store partition files from the fold's rows.

Runs as a mapInArrow function over rows sorted by (partition, key); each task writes the store
partitions it holds with the snapshot format's own writer and returns one metadata row per file
(the driver checks them and writes the manifest). Imports nothing but pyarrow and the format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from enhydra.snapshots.format import PartitionFile, write_partition_file

FILE_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("file", pa.string()),
        ("rows", pa.int64()),
        ("sha256", pa.string()),
        ("bytes", pa.int64()),
    ]
)
FILE_DDL = "partition int, file string, rows long, sha256 string, bytes long"
ROW_COLUMNS = ["key", "value", "key_text", "state", "last_offset"]


class SnapshotPartitions:
    """mapInArrow: write the store partitions a task holds, rows sorted by (partition, key)."""

    def __init__(self, directory: str, store: str) -> None:
        self.directory = directory
        self.store = store

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written: list[PartitionFile] = []
        source = _PeekBatches(iter(batches))
        while (partition := source.next_partition()) is not None:
            rows = source.rows_of(partition)
            written.append(write_partition_file(self.directory, self.store, partition, rows))
        yield pa.RecordBatch.from_pylist([w.__dict__ for w in written], schema=FILE_SCHEMA)


class _PeekBatches:
    """Splits a stream of batches sorted by partition into one stream per partition."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.batches = batches
        self.head: pa.RecordBatch | None = None

    def _fill(self) -> bool:
        while self.head is None or self.head.num_rows == 0:
            self.head = next(self.batches, None)
            if self.head is None:
                return False
        return True

    def next_partition(self) -> int | None:
        return self.head.column("partition")[0].as_py() if self._fill() else None

    def rows_of(self, partition: int) -> Iterator[pa.RecordBatch]:
        while self._fill():
            assert self.head is not None
            parts = self.head.column("partition").to_pylist()
            stop = next((i for i, p in enumerate(parts) if p != partition), len(parts))
            if stop == 0:
                return
            yield self.head.slice(0, stop).select(ROW_COLUMNS)
            self.head = self.head.slice(stop)
