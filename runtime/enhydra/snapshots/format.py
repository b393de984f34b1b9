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
import itertools
import json
import os
import queue
import re
import sys
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from enhydra.contracts.codec import Entry, decode_entry, encode_entry
from enhydra.contracts.partitioner import partition_for

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
            """Called only for names not fetched yet: each is kept, so hot loops pay a dict
            lookup, not this call."""
            if self._module is None:
                self._module = importlib.import_module(self._name)
            value = getattr(self._module, attr)
            setattr(self, attr, value)
            return value

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


_BATCH_ROWS = 65536  # rows per Arrow batch written (one Parquet row group each) or read back
_HASH_CHUNK = 1 << 20


class SnapshotError(Exception):
    """A snapshot cannot be written, opened or loaded; the message says which file and why."""


# --------------------------------------------------------------------------- small pieces


def partition_file(store: str, partition: int) -> str:
    """The one allowed relative path of a store partition's file."""
    return f"store={store}/partition={partition}.parquet"


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

_PIECE_ROWS = 1024  # pairs turned into Arrow at once
# Only these columns get min/max statistics: `lookup` and other readers filter on them.
_STATISTICS = ["key", "key_text", "last_offset"]


@functools.cache
def _pair_type() -> pa.DataType:
    return pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())])


def _key_text(key: bytes) -> str | None:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _decoded(key: bytes, value: bytes) -> tuple[str | None, str, int]:
    try:
        entry = decode_entry(value)
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"value of key {key!r} is not an Entry envelope: {exc}") from None
    return _key_text(key), orjson.dumps(entry.state).decode("utf-8"), entry.offset


def _batch_from_pairs(pairs: list[tuple[bytes, bytes]]) -> pa.RecordBatch:
    """The exact path: decode every entry (any JSON layout; refuses what is not an envelope)."""
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


_POWERS_OF_TEN = [10**i for i in range(19)]


class _Frames:
    """Where the parts of each stored envelope are, found with vector operations on a chunk.

    encode_entry stores `[offset,[command ids],state]` (and a version after the state when it is
    above 1). Positions are byte offsets into the
    chunk's data buffer; nothing is decoded or copied to find them.
    """

    def __init__(self, values: pa.Array, np: ModuleType) -> None:
        self.np = np
        self.values = values
        bounds = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
        self.starts = bounds[:-1].astype(np.int64)
        self.ends = bounds[1:].astype(np.int64)
        buffer = values.buffers()[2]
        self.data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, "u1")
        # The comma after the offset: the first comma of every value.
        self.comma = self.starts + pc.find_substring(values, ",").to_numpy()

    def offsets(self) -> pa.Array | None:
        """The leading numbers as int64, or None when a value does not start `[<int>,`."""
        np, data, starts, comma = self.np, self.data, self.starts, self.comma
        if not len(data) or (comma < starts + 2).any() or (comma > starts + 20).any():
            return None
        if (data[starts] != ord("[")).any():
            return None
        negative = data[starts + 1] == ord("-")
        first = starts + 1 + negative
        digits = comma - first
        if (digits < 1).any() or ((digits > 1) & (data[first] == ord("0"))).any():
            return None  # no number, or a leading zero JSON would refuse
        if (digits > 18).any():  # may not fit in int64: Arrow's range-checked parse
            return self._offsets_parsed()
        # All digits of the chunk in one (rows x widest) grid, right-aligned, summed with their
        # powers of ten: a few vector calls, so few waits for the GIL while the reader runs.
        place = np.arange(int(digits.max()))
        within = place < digits[:, None]
        at = np.where(within, comma[:, None] - 1 - place, comma[:, None])
        digit = np.where(within, data[at] - np.uint8(ord("0")), 0)
        if (digit > 9).any():  # not a digit (below "0" wraps around)
            return None
        value = digit.astype(np.int64) @ _POWERS_OF_TEN[: len(place)]
        return pa.array(np.where(negative, -value, value), pa.int64())

    def _offsets_parsed(self) -> pa.Array | None:
        head = pc.binary_slice(self.values, 1, 21)  # an int64 and its sign fit in 20 bytes
        number = pc.list_element(pc.split_pattern(head, ",", max_splits=1), 0)
        try:  # Arrow's integer parsing: digits and a sign only, range checked
            return number.cast(pa.string()).cast(pa.int64())
        except pa.ArrowInvalid:
            return None

    def states(self) -> Any:
        """The state texts (a view of the stored bytes), or None in another layout.

        The command ids end at the first "]" after the offset unless an id holds a "]" itself.
        Without backslashes in the ids every quote opens or closes an id, so an even count of
        quotes before that "]" shows it is outside every id.
        """
        np, data, starts, ends, comma = self.np, self.data, self.starts, self.ends, self.comma
        closing = np.flatnonzero(data == ord("]"))
        found = np.searchsorted(closing, comma)
        if (found >= len(closing)).any():
            return None
        close = closing[found]
        ok = (
            (close < ends - 3)
            & (data[comma + 1] == ord("["))
            & (data[np.minimum(close + 1, len(data) - 1)] == ord(","))
            & (data[ends - 1] == ord("]"))
        )
        if not ok.all():
            return None
        # `[offset,[ids],state,version]` (a state version above 1) ends in a digit, as does a
        # bare-number state: both take the exact path, which knows where the state ends.
        before = data[ends - 2]
        if ((before >= ord("0")) & (before <= ord("9"))).any():
            return None
        ids = np.empty(2 * len(starts), np.int64)  # [comma + 1, close) of each value
        ids[0::2], ids[1::2] = comma + 1, close
        backslash = data == ord("\\")
        # A chunk without any backslash is the usual case: one scan instead of one per id list.
        if backslash.any() and np.bitwise_or.reduceat(backslash.view(np.uint8), ids)[0::2].any():
            return None
        if np.bitwise_xor.reduceat((data == ord('"')).view(np.uint8), ids)[0::2].any():
            return None
        return self.view(close + 2, ends - 1)

    def view(self, start: Any, stop: Any) -> pa.Array:
        """data[start:stop] of every row as a binary_view array: no byte is copied."""
        np, data = self.np, self.data
        length = stop - start
        views = np.zeros((len(start), 4), np.int32)  # length, prefix (or inline), buffer, offset
        views[:, 0] = length
        raw = views.view(np.uint8)
        short = length <= 12
        last = len(data) - 1
        for i in range(12 if short.any() else 4):  # inline bytes, or the 4-byte prefix
            raw[:, 4 + i] = np.where(i < length, data[np.minimum(start + i, last)], 0)
        views[~short, 2] = 0
        views[~short, 3] = start[~short]
        buffers = [None, pa.py_buffer(views), self.values.buffers()[2]]
        return pa.Array.from_buffers(pa.binary_view(), len(start), buffers)


def _frames(values: pa.Array) -> _Frames | None:
    """The frames of a non-empty chunk; None without NumPy (a Spark executor may lack it)."""
    try:
        import numpy
    except ImportError:
        return None
    return _Frames(values, numpy) if len(values) else None


def _cut_envelopes(values: pa.Array) -> tuple[pa.Array, pa.Array] | None:
    """(state text, input offset) of envelopes as encode_entry stores them; None otherwise.

    The state is cut out of the stored text and the offset is its leading number: the same
    text and number decoding would give, for a fraction of the cost.
    """
    frames = _frames(values)
    if frames is None:
        return None
    offsets = frames.offsets()
    states = frames.states() if offsets is not None else None
    if states is None:
        return None
    try:
        return states.cast(pa.string()), offsets
    except pa.ArrowInvalid:  # not UTF-8
        return None


def _columns(keys: pa.Array, values: pa.Array) -> pa.RecordBatch:
    """All the file's columns from the stored bytes, a chunk at a time, without decoding.

    Decoding every entry to re-encode its state cost more than the rest of an export together.
    A chunk with anything else than encode_entry's layout takes the exact path, which decodes
    each entry and refuses one that is not an envelope. The state's own JSON is not checked.
    """
    if keys.null_count or values.null_count:
        raise SnapshotError("a key or value is null: a store partition holds bytes for both")
    cut = _cut_envelopes(values)
    if cut is None:
        return _batch_from_pairs(list(zip(keys.to_pylist(), values.to_pylist(), strict=True)))
    try:
        texts = keys.cast(pa.string())
    except pa.ArrowInvalid:  # some keys are not UTF-8: theirs is null
        texts = pa.array([_key_text(k) for k in keys.to_pylist()], pa.string())
    return pa.RecordBatch.from_arrays([keys, values, texts, *cut], schema=parquet_schema())


def reset_input_offsets(values: pa.Array) -> pa.Array:
    """The same envelopes with their input offset set to -1, as decode, set, encode would do.

    For a clone that reads another commands topic: the source's input offsets mean nothing
    there. The leading number is replaced in the stored text; another layout is decoded.
    """
    frames = _frames(values)
    if frames is not None and frames.offsets() is not None:
        rest = pc.list_element(pc.split_pattern(values, ",", max_splits=1), 1)
        return pc.binary_join_element_wise(pa.scalar(b"[-1,"), rest, b"")
    out = []
    for value in values.to_pylist():
        entry = decode_entry(value)
        entry.offset = -1
        out.append(encode_entry(entry))
    return pa.array(out, pa.binary())


# What the reading side hands over: Arrow arrays of (key, value) pairs read from Python
# objects, (keys, values) arrays, or a batch that already has every column.
Chunk = tuple[str, Any]


def _arrow_chunks(data: pa.Table | pa.RecordBatch, *, sort: bool) -> Iterator[Chunk]:
    """Chunks of an Arrow table or batch with at least key and value columns."""
    names = set(data.schema.names)
    if not {"key", "value"} <= names:
        raise SnapshotError(f"a partition needs 'key' and 'value' columns, got {sorted(names)}")
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    if sort:
        table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")]))
    schema = parquet_schema()
    complete = set(schema.names) <= names
    for batch in table.to_batches(_BATCH_ROWS):
        if complete:
            yield "batch", batch.select(schema.names).cast(schema)
        else:
            keys, values = batch.column("key"), batch.column("value")
            yield "columns", (keys.cast(pa.binary()), values.cast(pa.binary()))


def _iter_chunks(rows: Iterable[Any]) -> Iterator[Chunk]:
    """Chunks of a stream of (key, value) pairs and/or Arrow batches, in the caller's order.

    Pairs are turned into Arrow a few hundred at a time: the Python objects are still in the
    CPU cache then (65,536 at once made reading a store 1.6x slower); the pieces are joined
    into one chunk by whoever completes it.
    """
    rows = iter(rows)
    pieces: list[pa.StructArray] = []
    size = 0
    for first in rows:
        if isinstance(first, pa.RecordBatch | pa.Table):
            if pieces:
                yield "pairs", pieces
                pieces, size = [], 0
            yield from _arrow_chunks(first, sort=False)
            continue
        chunk = [first, *itertools.islice(rows, _PIECE_ROWS - 1)]
        try:
            piece = pa.array(chunk, _pair_type())
        except (pa.ArrowException, TypeError, ValueError):
            piece = None
        if piece is not None and not piece.null_count:
            pieces.append(piece)
            size += len(piece)
            if size >= _BATCH_ROWS:
                yield "pairs", pieces
                pieces, size = [], 0
            continue
        if pieces:
            yield "pairs", pieces
            pieces, size = [], 0
        # Arrow batches among the pairs, or keys/values that are not plain bytes: as before.
        pending: list[tuple[bytes, bytes]] = []
        for item in chunk:
            if isinstance(item, pa.RecordBatch | pa.Table):
                if pending:
                    yield "batch", _batch_from_pairs(pending)
                    pending = []
                yield from _arrow_chunks(item, sort=False)
                continue
            key, value = item
            pending.append((bytes(key), bytes(value)))
        if pending:
            yield "batch", _batch_from_pairs(pending)
    if pieces:
        yield "pairs", pieces


def _complete(chunk: Chunk) -> pa.RecordBatch:
    """The record batch to write for a chunk: every column, from the stored bytes."""
    kind, data = chunk
    if kind == "batch":
        return data
    if kind == "pairs":
        pairs = pa.concat_arrays(data) if len(data) > 1 else data[0]
        return _columns(pairs.field(0), pairs.field(1))
    return _columns(*data)


class _HashedFile:
    """A file that computes its sha256 and size as it is written, so nothing is read back."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("wb")
        self._digest = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self._digest.update(data)
        self.size += len(data)
        return self._file.write(data)

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Called by the Parquet writer when it finishes; the file itself stays open to sync."""

    def sync_and_close(self) -> str:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.closed = True
        return self._digest.hexdigest()

    def discard(self) -> None:
        self._file.close()
        self.closed = True


def _check_order(keys: pa.Array, previous: bytes | None, partition: int) -> bytes:
    """Refuse keys that are not strictly increasing bytes (so also duplicates); the last key."""
    n = len(keys)
    pairs = [(previous, keys[0].as_py())] if previous is not None else []
    if n > 1:
        bad = pc.less_equal(keys.slice(1), keys.slice(0, n - 1))
        if pc.any(bad).as_py():
            i = pc.index(bad, True).as_py()
            pairs.append((keys[i].as_py(), keys[i + 1].as_py()))
    for before, key in pairs:
        if key <= before:
            raise SnapshotError(
                f"partition {partition}: keys must be unique and in byte order; "
                f"{key!r} came after {before!r}"
            )
    return keys[n - 1].as_py()


def _write_parquet(out: _HashedFile, batches: Iterable[pa.RecordBatch], partition: int) -> int:
    """Check and write record batches; returns the rows written."""
    count = 0
    previous: bytes | None = None
    # Parquet writes pages of a few kB; buffered in Arrow, `out` (Python: it hashes) is called
    # once per 8 MiB instead of per page, each call a wait for the GIL.
    with (
        pa.BufferedOutputStream(pa.PythonFile(out, mode="w"), buffer_size=8 << 20) as sink,
        pq.ParquetWriter(
            sink,
            parquet_schema(),
            compression="zstd",
            use_dictionary=False,
            write_statistics=_STATISTICS,
        ) as writer,
    ):
        for batch in batches:
            if batch.num_rows == 0:
                continue
            previous = _check_order(batch.column(0), previous, partition)
            writer.write_batch(batch)
            count += batch.num_rows
    return count


_END = object()
_SWITCH_INTERVAL_S = 0.0001
_handoff_lock = threading.Lock()
_handoff_users = 0
_handoff_saved = 0.005


@contextlib.contextmanager
def _prompt_gil_handoff() -> Iterator[None]:
    """Let helper threads take the GIL back within 0.1 ms instead of Python's 5 ms.

    The reading thread runs Python without pause; every Arrow or NumPy call of a helper thread
    releases the GIL and must take it back to return. At the default switch interval each of
    those returns waited up to 5 ms, so the helpers mostly ran while the reader was blocked and
    the stages hardly overlapped. The interval is per process: it is lowered while any export
    or read-ahead runs and restored when the last one ends.
    """
    global _handoff_users, _handoff_saved
    with _handoff_lock:
        if _handoff_users == 0:
            _handoff_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_handoff_saved, _SWITCH_INTERVAL_S))
        _handoff_users += 1
    try:
        yield
    finally:
        with _handoff_lock:
            _handoff_users -= 1
            if _handoff_users == 0:
                sys.setswitchinterval(_handoff_saved)


def _write_in_threads(out: _HashedFile, chunks: Iterator[Chunk], partition: int) -> int:
    """Read `chunks` in this thread, complete them in a second, write them from a third.

    Reading a store is Python work that holds the GIL; completing the columns, compressing and
    hashing run in Arrow and hashlib without it, so the three overlap on two cores, and the
    operating system balances them.
    """
    handoff: queue.Queue[Any] = queue.Queue(maxsize=3)  # futures of batches, in order
    outcome: dict[str, Any] = {}

    def batches() -> Iterator[pa.RecordBatch]:
        for future in iter(handoff.get, _END):
            yield future.result()
        outcome["ended"] = True

    def write() -> None:
        try:
            outcome["rows"] = _write_parquet(out, batches(), partition)
        except BaseException as exc:
            outcome["error"] = exc
            if "ended" not in outcome:  # let the reader put its last chunks and the end
                while (future := handoff.get()) is not _END:
                    future.cancel()

    with (
        _prompt_gil_handoff(),
        ThreadPoolExecutor(1, thread_name_prefix="snapshot-columns") as columns,
    ):
        writer = threading.Thread(target=write, name="snapshot-writer", daemon=True)
        writer.start()
        try:
            for chunk in chunks:
                if "error" in outcome:
                    break
                handoff.put(columns.submit(_complete, chunk))
        finally:
            handoff.put(_END)
            writer.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"]


class PartitionTaken(SnapshotError):
    """Another writer placed this partition's file first (`exclusive`); this copy was dropped."""


def write_partition_file(
    directory: Path | str, store: str, partition: int, rows: Any, *, exclusive: bool = False
) -> PartitionFile:
    """Write one store partition's Parquet file (atomically) and describe it for the manifest.

    `exclusive`: never replace a file already there (raise PartitionTaken). A live snapshot
    needs it: when a partition moves during the snapshot, its old and new owner may both
    export it, and the manifest must describe the one file that stays.

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
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    if isinstance(rows, pa.Table | pa.RecordBatch):
        chunks = _arrow_chunks(rows, sort=True)
    else:
        chunks = _iter_chunks(rows)
    out = _HashedFile(tmp)
    try:
        count = _write_in_threads(out, chunks, partition)
        sha256 = out.sync_and_close()
        if exclusive:
            try:
                os.link(tmp, target)  # fails if the target exists: the first writer wins
            except FileExistsError:
                raise PartitionTaken(f"{rel} was written by another instance first") from None
            tmp.unlink()
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        if not out.closed:
            out.discard()
        tmp.unlink(missing_ok=True)
        raise
    return PartitionFile(partition=partition, file=rel, rows=count, sha256=sha256, bytes=out.size)


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
        for batch in self.iter_batches(partition, ["key", "value"]):
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)

    def iter_batches(
        self, partition: int, columns: list[str] | None = None, *, batch_rows: int = _BATCH_ROWS
    ) -> Iterator[Any]:
        """Arrow record batches of one store partition, in key order."""
        handle = pq.ParquetFile(self.path(partition))
        yield from handle.iter_batches(batch_size=batch_rows, columns=columns)

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
    expected_fingerprint: str | Collection[str] | None = None,
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
    accepted = (
        {expected_fingerprint} if isinstance(expected_fingerprint, str) else expected_fingerprint
    )
    foreign = accepted is not None and manifest.fingerprint not in accepted
    if foreign and not force:
        expected = (
            expected_fingerprint if isinstance(expected_fingerprint, str) else next(iter(accepted))
        )
        raise SnapshotError(
            f"{root} was taken from a different topology (fingerprint "
            f"{manifest.fingerprint}, expected {expected}: app id, store, "
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


T = TypeVar("T")


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """`items`, each produced by a second thread while the caller works on the one before.

    Decoding a Parquet batch runs in Arrow without the GIL, so it overlaps with the caller's
    Python work (RocksDB writes, producing) on the batch before.
    """
    with _prompt_gil_handoff(), ThreadPoolExecutor(1, thread_name_prefix="snapshot-read") as pool:
        end = object()
        pending = pool.submit(next, items, end)
        while (item := pending.result()) is not end:
            pending = pool.submit(next, items, end)
            yield item  # type: ignore[misc]


Progress = Callable[[int, int, int], None]  # (partition, rows loaded, rows in partition)


def load_into_stores(
    snapshot: Snapshot,
    store_dir: Path | str,
    *,
    batch_rows: int = _BATCH_ROWS,
    progress: Progress | None = None,
    replace: bool = False,
) -> dict[int, int]:
    """Write every partition into `<store_dir>/<partition>` (RocksDB).

    Each partition's rows, already sorted, become one table file the store adopts whole, and
    then the store's input offset checkpoint is set to cut - 1 (the last input record the
    state contains); a load cut short leaves neither rows nor a checkpoint. Refuses stores
    that already hold keys unless `replace`. Returns rows loaded per partition.
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

            def columns(p: int = partition, total: int = part.rows) -> Iterator[tuple[list, list]]:
                done = 0
                batches = snapshot.iter_batches(p, ["key", "value"], batch_rows=batch_rows)
                for batch in read_ahead(batches):
                    yield batch.column(0).to_pylist(), batch.column(1).to_pylist()
                    done += batch.num_rows
                    if progress is not None:
                        progress(p, done, total)

            loaded[partition] = store.ingest_sorted(
                columns(), input_offset=cut - 1 if cut is not None else None
            )
            if progress is not None and not loaded[partition]:
                progress(partition, 0, part.rows)
        finally:
            with contextlib.suppress(Exception):
                store.close()
    return loaded
