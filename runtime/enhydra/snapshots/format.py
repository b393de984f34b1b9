"""The snapshot format: a manifest plus one Parquet file per store partition.

This is the contract between the PySpark backfill, the streaming runtime and clone/restore, so
it is plain files with a versioned manifest (see docs/snapshot-format.md):

    <snapshot>/manifest.json                          written last, atomically
    <snapshot>/store=<name>/partition=<p>.parquet     key, value, key_text, state, last_offset

`value` holds the store's Entry envelope byte for byte, so loading a snapshot into RocksDB needs
no serde; the decoded columns are there for people (Spark, DuckDB, pandas). A directory without
`manifest.json` is never a complete snapshot: whoever wrote it died before finishing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from enhydra.contracts.codec import Entry, decode_entry

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:

    class _OnFirstUse:
        """A module imported when first touched. Every worker imports this module, but only
        an export, a restore or a lookup needs pyarrow, which costs ~50 MB of resident memory
        from the moment it is imported."""

        def __init__(self, name: str) -> None:
            self._name = name
            self._module: ModuleType | None = None

        def __getattr__(self, attr: str) -> Any:
            if self._module is None:
                self._module = importlib.import_module(self._name)
            return getattr(self._module, attr)

    pa = _OnFirstUse("pyarrow")
    pc = _OnFirstUse("pyarrow.compute")
    pq = _OnFirstUse("pyarrow.parquet")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@functools.cache
def parquet_schema() -> pa.Schema:
    """The columns of every store partition file, in order."""
    return pa.schema(
        [
            pa.field("key", pa.binary(), nullable=False),
            pa.field("value", pa.binary(), nullable=False),
            pa.field("key_text", pa.string()),
            pa.field("state", pa.string()),
            pa.field("last_offset", pa.int64()),
        ]
    )


_BATCH_ROWS = 8192
_HASH_CHUNK = 1 << 20


class SnapshotError(Exception):
    """A snapshot cannot be written, opened or loaded; the message says which file and why."""


# --------------------------------------------------------------------------- small pieces


def topology_fingerprint(
    *, app_id: str, store: str, partitions: int, commands_topic: str, changelog_topic: str
) -> str:
    """What must match for a snapshot's partitions to mean the same keys in another service."""
    canonical = json.dumps(
        {
            "app_id": app_id,
            "store": store,
            "partitions": partitions,
            "commands_topic": commands_topic,
            "changelog_topic": changelog_topic,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def partition_file(store: str, partition: int) -> str:
    """The one allowed relative path of a store partition's file."""
    return f"store={store}/partition={partition}.parquet"


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2), the way the runtime places keys."""
    # Imported here: Spark executors import this module to write partition files, and they
    # must not need aiokafka (a plain Python with pyspark, pyarrow and orjson runs them).
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Cut:
    """Per input partition, the next offset to process: the snapshot holds everything before."""

    topic: str
    offsets: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
        }

    @classmethod
    def from_json(cls, raw: Any) -> Cut:
        if not isinstance(raw, dict) or not isinstance(raw.get("topic"), str):
            raise ValueError("cut must be an object with a 'topic' string")
        offsets = raw.get("offsets")
        if not isinstance(offsets, dict):
            raise ValueError("cut.offsets must be an object {partition: offset}")
        parsed: dict[int, int] = {}
        for p, o in offsets.items():
            if not str(p).isdigit() or not isinstance(o, int) or isinstance(o, bool) or o < 0:
                raise ValueError(f"cut.offsets[{p!r}] = {o!r}: need a partition number -> offset")
            parsed[int(p)] = o
        return cls(raw["topic"], parsed)


@dataclass(frozen=True)
class PartitionFile:
    """One store partition's file as the manifest records it."""

    partition: int
    file: str
    rows: int
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    format_version: int
    app_id: str
    store: str
    fingerprint: str
    created_at: str
    source: str
    cut: Cut
    partitions: list[PartitionFile] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "app_id": self.app_id,
            "store": self.store,
            "fingerprint": self.fingerprint,
            "created_at": self.created_at,
            "source": self.source,
            "cut": self.cut.to_json(),
            "partitions": [asdict(p) for p in self.partitions],
        }

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)


# --------------------------------------------------------------------------- writing


def _decoded(key: bytes, value: bytes) -> tuple[str | None, str, int]:
    try:
        entry = decode_entry(value)
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"value of key {key!r} is not an Entry envelope: {exc}") from None
    try:
        key_text: str | None = key.decode("utf-8")
    except UnicodeDecodeError:
        key_text = None
    return key_text, orjson.dumps(entry.state).decode("utf-8"), entry.offset


def _batch_from_pairs(pairs: list[tuple[bytes, bytes]]) -> pa.RecordBatch:
    keys, values, texts, states, offsets = [], [], [], [], []
    for key, value in pairs:
        text, state, offset = _decoded(key, value)
        keys.append(key)
        values.append(value)
        texts.append(text)
        states.append(state)
        offsets.append(offset)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(texts, pa.string()),
            pa.array(states, pa.string()),
            pa.array(offsets, pa.int64()),
        ],
        schema=parquet_schema(),
    )


def _normalize(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """Arrow input with at least key and value; decoded columns are added when missing."""
    names = set(batch.schema.names)
    if not {"key", "value"} <= names:
        raise SnapshotError(f"a partition needs 'key' and 'value' columns, got {sorted(names)}")
    schema = parquet_schema()
    if set(schema.names) <= names:
        return batch.select(schema.names).cast(schema)
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    return _batch_from_pairs(list(zip(keys, values, strict=True)))


def _arrow_batches(rows: Any) -> tuple[Iterator[pa.RecordBatch], bool]:
    """(batches, already_sorted_by_caller) from a Table, a RecordBatch or an iterable."""
    if isinstance(rows, pa.Table | pa.RecordBatch):
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        normalized = _normalize(table)
        if isinstance(normalized, pa.RecordBatch):
            normalized = pa.Table.from_batches([normalized])
        table = normalized.take(pc.sort_indices(table, sort_keys=[("key", "ascending")]))
        return iter(table.to_batches(_BATCH_ROWS)), True
    return _iter_batches(rows), False


def _iter_batches(rows: Iterable[Any]) -> Iterator[pa.RecordBatch]:
    pending: list[tuple[bytes, bytes]] = []
    for item in rows:
        if isinstance(item, pa.RecordBatch | pa.Table):
            if pending:
                yield _batch_from_pairs(pending)
                pending = []
            normalized = _normalize(item)
            if isinstance(normalized, pa.Table):
                yield from normalized.to_batches()
            else:
                yield normalized
            continue
        key, value = item
        pending.append((bytes(key), bytes(value)))
        if len(pending) >= _BATCH_ROWS:
            yield _batch_from_pairs(pending)
            pending = []
    if pending:
        yield _batch_from_pairs(pending)


def write_partition_file(
    directory: Path | str, store: str, partition: int, rows: Any
) -> PartitionFile:
    """Write one store partition's Parquet file (atomically) and describe it for the manifest.

    `rows` is an Arrow Table/RecordBatch (sorted here), or an iterable of (key, value) pairs or
    Arrow batches already in key order (streamed with bounded memory; the order is checked,
    which also refuses duplicate keys). Runs anywhere the directory is visible, e.g. in a Spark
    task, so the driver never has to see the rows.
    """
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise SnapshotError(f"partition must be a number >= 0, got {partition!r}")
    directory = Path(directory)
    rel = partition_file(store, partition)
    target = directory / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    batches, _ = _arrow_batches(rows)
    count = 0
    previous: bytes | None = None
    try:
        with pq.ParquetWriter(tmp, parquet_schema(), compression="zstd") as writer:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                keys = batch.column(0).to_pylist()
                for key in keys:
                    if previous is not None and key <= previous:
                        raise SnapshotError(
                            f"partition {partition}: keys must be unique and in byte order; "
                            f"{key!r} came after {previous!r}"
                        )
                    previous = key
                writer.write_batch(batch)
                count += batch.num_rows
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sha256, size = file_digest(target)
    return PartitionFile(partition=partition, file=rel, rows=count, sha256=sha256, bytes=size)


class SnapshotWriter:
    """Write a snapshot: partitions first (in any order, from anywhere), the manifest last.

    Until `finish` renames the manifest into place the directory is not a snapshot, so a crash
    at any point leaves nothing that a reader would take for complete.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        app_id: str,
        store: str,
        fingerprint: str,
        source: str,
    ) -> None:
        self.directory = Path(directory)
        if (self.directory / MANIFEST).exists():
            raise SnapshotError(f"{self.directory} already holds a snapshot ({MANIFEST} exists)")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", store):
            raise SnapshotError(f"store name {store!r}: use letters, digits, '-' or '_'")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.app_id = app_id
        self.store = store
        self.fingerprint = fingerprint
        self.source = source
        self.files: dict[int, PartitionFile] = {}
        self.manifest: Manifest | None = None

    def write_partition(self, partition: int, rows: Any) -> PartitionFile:
        """Write a store partition from an Arrow table or an iterable of (key, value)."""
        written = write_partition_file(self.directory, self.store, partition, rows)
        return self.add_partition(written)

    def add_partition(self, written: PartitionFile) -> PartitionFile:
        """Record a file that `write_partition_file` wrote elsewhere (e.g. in a Spark task)."""
        if written.partition in self.files:
            raise SnapshotError(f"partition {written.partition} written twice")
        if written.file != partition_file(self.store, written.partition):
            raise SnapshotError(f"partition {written.partition}: unexpected file {written.file!r}")
        path = self.directory / written.file
        if not path.is_file() or path.stat().st_size != written.bytes:
            raise SnapshotError(f"{path} is missing or not {written.bytes} bytes")
        self.files[written.partition] = written
        return written

    def finish(self, cut: Cut | Mapping[str, Any], *, partitions: int | None = None) -> Manifest:
        """Write manifest.json atomically (temp file, fsync, rename, fsync of the directory).

        `partitions` (the store's partition count) adds an empty file for every partition that
        had no rows, so a snapshot always covers partitions 0..n-1.
        """
        if self.manifest is not None:
            raise SnapshotError("finish() was already called")
        cut = cut if isinstance(cut, Cut) else Cut.from_json(_cut_json(cut))
        if partitions is not None:
            for p in range(partitions):
                if p not in self.files:
                    self.write_partition(p, [])
        expected = set(range(len(self.files)))
        if set(self.files) != expected:
            raise SnapshotError(
                f"partitions must be 0..{len(self.files) - 1}, got {sorted(self.files)}"
            )
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            app_id=self.app_id,
            store=self.store,
            fingerprint=self.fingerprint,
            created_at=_utc_now(),
            source=self.source,
            cut=cut,
            partitions=[self.files[p] for p in sorted(self.files)],
        )
        target = self.directory / MANIFEST
        tmp = self.directory / f".{MANIFEST}.{os.getpid()}.tmp"
        try:
            with tmp.open("wb") as handle:
                handle.write(json.dumps(manifest.to_json(), indent=2).encode("utf-8") + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)
        self.manifest = manifest
        return manifest


def _cut_json(cut: Mapping[str, Any]) -> dict[str, Any]:
    offsets = cut.get("offsets", {})
    return {"topic": cut.get("topic"), "offsets": {str(p): o for p, o in offsets.items()}}


# --------------------------------------------------------------------------- reading


def _parse_manifest(path: Path) -> Manifest:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(raw, dict):
        raise SnapshotError(f"{path}: the manifest must be a JSON object")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"{path}: format_version {version!r} is not supported (this Enhydra reads "
            f"version {FORMAT_VERSION}; upgrade Enhydra to read newer snapshots)"
        )
    try:
        parts = raw["partitions"]
        if not isinstance(parts, list):
            raise ValueError("partitions must be a list")
        files = [
            PartitionFile(
                partition=_int(p["partition"]),
                file=str(p["file"]),
                rows=_int(p["rows"]),
                sha256=str(p["sha256"]),
                bytes=_int(p["bytes"]),
            )
            for p in parts
        ]
        return Manifest(
            format_version=version,
            app_id=str(raw["app_id"]),
            store=str(raw["store"]),
            fingerprint=str(raw["fingerprint"]),
            created_at=str(raw["created_at"]),
            source=str(raw["source"]),
            cut=Cut.from_json(raw["cut"]),
            partitions=files,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"{path}: malformed manifest: {exc!r}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return value


def _safe_path(root: Path, rel: str) -> Path:
    """Resolve a manifest path, refusing anything that could leave the snapshot directory."""
    if not rel or rel.startswith(("/", "\\")) or os.path.isabs(rel) or "\\" in rel:
        raise SnapshotError(f"{rel!r}: absolute paths are not allowed in a snapshot")
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise SnapshotError(f"{rel!r}: '..', '.' and empty segments are not allowed")
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise SnapshotError(f"{rel!r}: {current} is a symlink; snapshots hold plain files")
    resolved = current.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise SnapshotError(f"{rel!r} escapes the snapshot directory {root}")
    return current


class Snapshot:
    """An opened, verified snapshot."""

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        self.directory = directory
        self.manifest = manifest
        self.partitions: dict[int, PartitionFile] = {p.partition: p for p in manifest.partitions}

    @property
    def cut(self) -> Cut:
        return self.manifest.cut

    def path(self, partition: int) -> Path:
        try:
            return self.directory / self.partitions[partition].file
        except KeyError:
            raise SnapshotError(f"the snapshot has no partition {partition}") from None

    def iter_partition(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) bytes of one store partition, in key order."""
        handle = pq.ParquetFile(self.path(partition))
        for batch in handle.iter_batches(batch_size=_BATCH_ROWS, columns=["key", "value"]):
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)

    def iter_batches(self, partition: int, columns: list[str] | None = None) -> Iterator[Any]:
        handle = pq.ParquetFile(self.path(partition))
        yield from handle.iter_batches(batch_size=_BATCH_ROWS, columns=columns)

    def entries(self, partition: int) -> Iterator[tuple[bytes, Entry]]:
        for key, value in self.iter_partition(partition):
            yield key, decode_entry(value)

    def lookup(self, key: bytes | str) -> bytes | None:
        """The stored value of a key (found in the partition the runtime would use), or None."""
        raw = key.encode("utf-8") if isinstance(key, str) else key
        if not self.partitions:
            return None
        partition = partition_for(raw, len(self.partitions))
        table = pq.read_table(self.path(partition), columns=["value"], filters=[("key", "=", raw)])
        return table.column(0)[0].as_py() if table.num_rows else None


def open_snapshot(
    directory: Path | str,
    expected_fingerprint: str | None = None,
    *,
    force: bool = False,
    verify: bool = True,
) -> Snapshot:
    """Open a snapshot after checking that it is complete, intact and meant for this topology."""
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError(f"{root} is not a directory")
    manifest_path = root / MANIFEST
    if manifest_path.is_symlink():
        raise SnapshotError(f"{manifest_path} is a symlink; snapshots hold plain files")
    if not manifest_path.is_file():
        raise SnapshotError(
            f"{root} has no {MANIFEST}: not a complete snapshot (the writer may have stopped "
            "before finishing; take it again)"
        )
    manifest = _parse_manifest(manifest_path)
    foreign = expected_fingerprint is not None and manifest.fingerprint != expected_fingerprint
    if foreign and not force:
        raise SnapshotError(
            f"{root} was taken from a different topology (fingerprint "
            f"{manifest.fingerprint}, expected {expected_fingerprint}: app id, store, "
            "partitions or topics differ); pass force=True (--force) to use it anyway"
        )
    seen: set[int] = set()
    for part in manifest.partitions:
        if part.partition in seen:
            raise SnapshotError(f"{manifest_path}: partition {part.partition} listed twice")
        seen.add(part.partition)
        path = _safe_path(root, part.file)
        expected = partition_file(manifest.store, part.partition)
        if part.file != expected:
            raise SnapshotError(
                f"{manifest_path}: unexpected file {part.file!r} for partition "
                f"{part.partition} (expected {expected!r})"
            )
        if not path.is_file():
            raise SnapshotError(f"{path} is listed in the manifest but missing")
        if verify:
            sha256, size = file_digest(path)
            if size != part.bytes:
                raise SnapshotError(
                    f"{path}: {size} bytes, the manifest says {part.bytes} (truncated or changed)"
                )
            if sha256 != part.sha256:
                raise SnapshotError(f"{path}: sha256 mismatch (corrupted or changed)")
    if seen != set(range(len(seen))):
        raise SnapshotError(f"{manifest_path}: partitions must be 0..n-1, got {sorted(seen)}")
    return Snapshot(root, manifest)


# --------------------------------------------------------------------------- loading


Progress = Callable[[int, int, int], None]  # (partition, rows loaded, rows in partition)


def load_into_stores(
    snapshot: Snapshot,
    store_dir: Path | str,
    *,
    batch_rows: int = 10_000,
    progress: Progress | None = None,
    replace: bool = False,
) -> dict[int, int]:
    """Write every partition into `<store_dir>/<partition>` (RocksDB), batched.

    The last batch of each partition also sets the store's input offset checkpoint to
    cut - 1 (the last input record the state contains), so the store and the cut agree
    atomically; a load cut short leaves no checkpoint. Refuses stores that already hold keys
    unless `replace`. Returns rows loaded per partition.
    """
    from enhydra.stores.partition import PartitionStore

    root = Path(store_dir)
    loaded: dict[int, int] = {}
    for partition, part in sorted(snapshot.partitions.items()):
        path = root / str(partition)
        if replace:
            PartitionStore.wipe(path)
        store = PartitionStore(path)
        try:
            if not replace and next(store.items(), None) is not None:
                raise SnapshotError(
                    f"{path} already holds keys; load into an empty state dir or pass replace"
                )
            cut = snapshot.cut.offsets.get(partition)
            input_offset = cut - 1 if cut is not None else None
            batch: list[tuple[bytes, bytes]] = []
            done = 0
            for item in snapshot.iter_partition(partition):
                batch.append(item)
                if len(batch) >= batch_rows:
                    store.write(batch)
                    done += len(batch)
                    batch = []
                    if progress is not None:
                        progress(partition, done, part.rows)
            store.write(batch, input_offset=input_offset)
            done += len(batch)
            if progress is not None:
                progress(partition, done, part.rows)
            loaded[partition] = done
        finally:
            with contextlib.suppress(Exception):
                store.close()
    return loaded
