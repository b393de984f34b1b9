"""Snapshots: all of a store's state up to a cut, as a manifest plus Parquet files.

The format (format.py, docs/snapshot-format.md) is the contract between the PySpark backfill,
the streaming runtime and clone/restore.
"""

from enhydra.snapshots.format import (
    FORMAT_VERSION,
    MANIFEST,
    Cut,
    Manifest,
    PartitionFile,
    Snapshot,
    SnapshotError,
    SnapshotWriter,
    load_into_stores,
    open_snapshot,
    partition_file,
    write_partition_file,
)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Cut",
    "Manifest",
    "PartitionFile",
    "Snapshot",
    "SnapshotError",
    "SnapshotWriter",
    "load_into_stores",
    "open_snapshot",
    "partition_file",
    "write_partition_file",
]
