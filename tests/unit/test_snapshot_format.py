"""The snapshot format: what is written reads back intact, and every bad snapshot is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra.contracts.codec import Entry, decode_entry, encode_entry
from enhydra.contracts.fingerprint import accepted_store_fingerprints, store_fingerprint
from enhydra.snapshots import (
    MANIFEST,
    Cut,
    SnapshotError,
    SnapshotWriter,
    load_into_stores,
    open_snapshot,
)
from enhydra.snapshots.format import partition_for, reset_input_offsets
from enhydra.stores.partition import PartitionStore

PARTITIONS = 3
FINGERPRINT = store_fingerprint(
    app_id="bank",
    store="accounts",
    partitions=PARTITIONS,
    commands_topic="bank-commands",
    changelog_topic="bank-accounts-changelog",
)


def entries(count: int) -> dict[bytes, bytes]:
    return {
        f"acct-{i:04d}".encode(): encode_entry(
            Entry({"balance": i * 10, "status": "open"}, offset=i, command_ids=[f"c{i}"])
        )
        for i in range(count)
    }


def write_snapshot(directory: Path, data: dict[bytes, bytes]) -> Path:
    """Place keys like the runtime (murmur2); a table, a stream of batches, a stream of pairs."""
    by_partition: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for key, value in data.items():
        by_partition[partition_for(key, PARTITIONS)].append((key, value))
    writer = SnapshotWriter(
        directory, app_id="bank", store="accounts", fingerprint=FINGERPRINT, source="live"
    )
    rows0 = by_partition[0]
    writer.write_partition(
        0, pa.table({"key": [k for k, _ in rows0], "value": [v for _, v in rows0]})
    )
    rows1 = sorted(by_partition[1])
    half = len(rows1) // 2
    writer.write_partition(
        1,
        (
            pa.record_batch({"key": [k for k, _ in part], "value": [v for _, v in part]})
            for part in (rows1[:half], rows1[half:])
        ),
    )
    writer.write_partition(2, sorted(by_partition[2]))
    writer.finish(Cut("bank-commands", {0: 11, 1: 0, 2: 7}), partitions=PARTITIONS)
    return directory


def rewrite_manifest(directory: Path, change) -> None:
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_round_trip(tmp_path: Path) -> None:
    data = entries(200)
    snap = open_snapshot(write_snapshot(tmp_path / "s", data), FINGERPRINT)
    m = snap.manifest
    assert (m.format_version, m.app_id, m.store, m.source) == (1, "bank", "accounts", "live")
    assert m.created_at.endswith("Z")
    assert snap.cut == Cut("bank-commands", {0: 11, 1: 0, 2: 7})
    assert sorted(snap.partitions) == [0, 1, 2]
    assert m.rows == 200
    read_back: dict[bytes, bytes] = {}
    for p in snap.partitions:
        keys = [k for k, _ in snap.iter_partition(p)]
        assert keys == sorted(keys)  # rows sorted by key bytes
        assert all(partition_for(k, PARTITIONS) == p for k in keys)
        read_back.update(snap.iter_partition(p))
    assert read_back == data
    assert snap.lookup("acct-0007") == data[b"acct-0007"]
    assert snap.lookup(b"nobody") is None
    # Decoded columns are there for people and other tools.
    row = pq.read_table(snap.path(partition_for(b"acct-0003", PARTITIONS))).to_pylist()
    decoded = {r["key_text"]: r for r in row}["acct-0003"]
    assert json.loads(decoded["state"]) == {"balance": 30, "status": "open"}
    assert decoded["last_offset"] == 3


@settings(max_examples=30, deadline=None)
@given(
    st.dictionaries(
        st.binary(min_size=1, max_size=12),
        st.tuples(st.integers(-1, 2**40), st.lists(st.text(max_size=5), max_size=3)),
        max_size=40,
    )
)
def test_any_keys_round_trip_in_byte_order(tmp_path_factory, data) -> None:
    directory = tmp_path_factory.mktemp("h")
    values = {k: encode_entry(Entry({"v": o}, o, ids)) for k, (o, ids) in data.items()}
    writer = SnapshotWriter(directory, app_id="a", store="s", fingerprint="f", source="test")
    writer.write_partition(0, pa.table({"key": list(values), "value": list(values.values())}))
    writer.finish({"topic": "a-commands", "offsets": {0: 1}})
    snap = open_snapshot(directory)
    rows = list(snap.iter_partition(0))
    assert [k for k, _ in rows] == sorted(values)
    assert dict(rows) == values


def test_load_into_stores_sets_the_input_checkpoint(tmp_path: Path) -> None:
    data = entries(120)
    snap = open_snapshot(write_snapshot(tmp_path / "s", data))
    seen: list[tuple[int, int, int]] = []
    loaded = load_into_stores(
        snap, tmp_path / "state", batch_rows=16, progress=lambda *a: seen.append(a)
    )
    assert sum(loaded.values()) == 120
    assert seen[-1][0] == 2 and all(done <= total for _, done, total in seen)
    assert len(seen) > PARTITIONS  # batches report progress, not only whole partitions
    merged: dict[bytes, bytes] = {}
    for p, cut in snap.cut.offsets.items():
        store = PartitionStore(tmp_path / "state" / str(p))
        try:
            assert store.input_offset == cut - 1
            assert store.changelog_offset == -1
            merged.update(store.items())
        finally:
            store.close()
    assert merged == data
    with pytest.raises(SnapshotError, match="already holds keys"):
        load_into_stores(snap, tmp_path / "state")
    assert sum(load_into_stores(snap, tmp_path / "state", replace=True).values()) == 120


def test_manifest_is_written_last_and_atomically(tmp_path: Path, monkeypatch) -> None:
    directory = tmp_path / "s"
    writer = SnapshotWriter(directory, app_id="a", store="s", fingerprint="f", source="test")
    writer.write_partition(0, [(b"k", encode_entry(Entry(1, 0, ["c"])))])
    # Partitions alone are not a snapshot.
    with pytest.raises(SnapshotError, match=r"no manifest\.json: not a complete snapshot"):
        open_snapshot(directory)

    def crash(src, dst):
        raise OSError("killed during rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        writer.finish(Cut("a-commands", {0: 1}))
    monkeypatch.undo()
    # Neither a manifest nor a temporary file that could pass for one is left behind.
    assert sorted(p.name for p in directory.iterdir()) == ["store=s"]
    with pytest.raises(SnapshotError, match="not a complete snapshot"):
        open_snapshot(directory)
    writer.finish(Cut("a-commands", {0: 1}))
    assert open_snapshot(directory).manifest.rows == 1
    with pytest.raises(SnapshotError, match="already holds a snapshot"):
        SnapshotWriter(directory, app_id="a", store="s", fingerprint="f", source="test")


def test_refuses_unknown_format_version(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    rewrite_manifest(directory, lambda m: m.update(format_version=2))
    with pytest.raises(SnapshotError, match="format_version 2 is not supported"):
        open_snapshot(directory)


def test_refuses_a_corrupted_file(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(50))
    path = directory / "store=accounts" / "partition=1.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"partition=1\.parquet: sha256 mismatch"):
        open_snapshot(directory)


def test_refuses_a_truncated_file(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(50))
    path = directory / "store=accounts" / "partition=0.parquet"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SnapshotError, match="bytes, the manifest says"):
        open_snapshot(directory)


def test_refuses_a_missing_file(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    (directory / "store=accounts" / "partition=2.parquet").unlink()
    with pytest.raises(SnapshotError, match="listed in the manifest but missing"):
        open_snapshot(directory)


def test_refuses_a_foreign_fingerprint_unless_forced(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    other = store_fingerprint(
        app_id="bank",
        store="accounts",
        partitions=6,
        commands_topic="bank-commands",
        changelog_topic="bank-accounts-changelog",
    )
    assert other != FINGERPRINT
    with pytest.raises(SnapshotError, match="different topology"):
        open_snapshot(directory, other)
    assert open_snapshot(directory, other, force=True).manifest.fingerprint == FINGERPRINT


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/passwd", "absolute paths are not allowed"),
        ("../outside.parquet", "'..', '.' and empty segments are not allowed"),
        ("store=accounts/../../x.parquet", "'..', '.' and empty segments are not allowed"),
        ("store=accounts/partition=9.parquet", "unexpected file"),
        ("extra.parquet", "unexpected file"),
    ],
)
def test_refuses_paths_that_escape_or_are_unexpected(
    tmp_path: Path, path: str, message: str
) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    (directory / "extra.parquet").write_bytes(b"x")

    def point_elsewhere(manifest: dict) -> None:
        manifest["partitions"][0]["file"] = path

    rewrite_manifest(directory, point_elsewhere)
    with pytest.raises(SnapshotError, match=message):
        open_snapshot(directory)


def test_refuses_symlinks(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    outside = tmp_path / "outside.parquet"
    target = directory / "store=accounts" / "partition=0.parquet"
    target.rename(outside)
    target.symlink_to(outside)
    with pytest.raises(SnapshotError, match="is a symlink"):
        open_snapshot(directory)


def test_refuses_a_symlinked_store_directory(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    elsewhere = tmp_path / "elsewhere"
    (directory / "store=accounts").rename(elsewhere)
    (directory / "store=accounts").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SnapshotError, match="is a symlink"):
        open_snapshot(directory)


def test_refuses_duplicate_and_missing_partitions(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    rewrite_manifest(directory, lambda m: m["partitions"].append(m["partitions"][0]))
    with pytest.raises(SnapshotError, match="partition 0 listed twice"):
        open_snapshot(directory)
    rewrite_manifest(directory, lambda m: m.update(partitions=m["partitions"][1:3]))
    with pytest.raises(SnapshotError, match=r"partitions must be 0\.\.n-1"):
        open_snapshot(directory)


def test_refuses_a_malformed_manifest(tmp_path: Path) -> None:
    directory = write_snapshot(tmp_path / "s", entries(10))
    rewrite_manifest(directory, lambda m: m.pop("cut"))
    with pytest.raises(SnapshotError, match="malformed manifest"):
        open_snapshot(directory)
    (directory / MANIFEST).write_text("{not json")
    with pytest.raises(SnapshotError, match="unreadable manifest"):
        open_snapshot(directory)


def test_writer_refuses_unsorted_streams_and_bad_values(tmp_path: Path) -> None:
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    value = encode_entry(Entry(1, 0, []))
    with pytest.raises(SnapshotError, match="keys must be unique and in byte order"):
        writer.write_partition(0, [(b"b", value), (b"a", value)])
    with pytest.raises(SnapshotError, match="keys must be unique"):
        writer.write_partition(0, [(b"a", value), (b"a", value)])
    with pytest.raises(SnapshotError, match="not an Entry envelope"):
        writer.write_partition(0, [(b"a", b"not json")])
    assert not list((tmp_path / "s").rglob("*.tmp"))
    # Arrays compare as unsigned bytes, like RocksDB's default comparator.
    writer.write_partition(0, pa.table({"key": [b"\xff", b"\x01", b"a"], "value": [value] * 3}))
    writer.finish(Cut("a-commands", {0: 1}))
    keys = [k for k, _ in open_snapshot(tmp_path / "s").iter_partition(0)]
    assert keys == [b"\x01", b"a", b"\xff"]
    assert decode_entry(open_snapshot(tmp_path / "s").lookup(b"a") or b"[0,[],0]").state == 1


def test_fingerprint_is_stable_and_sensitive() -> None:
    args = {
        "app_id": "bank",
        "store": "accounts",
        "partitions": 3,
        "commands_topic": "bank-commands",
        "changelog_topic": "bank-accounts-changelog",
    }
    assert store_fingerprint(**args) == FINGERPRINT
    assert FINGERPRINT.startswith("sha256:") and len(FINGERPRINT) == 7 + 64
    for name, other in [("app_id", "x"), ("store", "y"), ("partitions", 4)]:
        assert store_fingerprint(**{**args, name: other}) != FINGERPRINT


def test_a_snapshot_from_before_the_one_fingerprint_still_opens_and_a_foreign_one_does_not(
    tmp_path,
) -> None:
    """Snapshots once recorded their own hash of the store's identity; restores keep
    accepting it, while any change to the identity is still refused."""
    args = {
        "app_id": "bank",
        "store": "accounts",
        "partitions": 3,
        "commands_topic": "bank-commands",
        "changelog_topic": "bank-accounts-changelog",
    }
    current, legacy = accepted_store_fingerprints(**args)
    assert current == store_fingerprint(**args) != legacy
    assert legacy == "sha256:864d5619d9473be25ff9bbf3ad816265e25983bc98c93e05bc26780d8808a525"
    for fingerprint in (current, legacy):
        writer = SnapshotWriter(
            tmp_path / fingerprint[7:15],
            app_id="bank",
            store="accounts",
            fingerprint=fingerprint,
            source="test",
        )
        for p in range(3):
            writer.write_partition(p, [])
        writer.finish(Cut("bank-commands", {0: 0, 1: 0, 2: 0}), partitions=3)
        assert open_snapshot(tmp_path / fingerprint[7:15], accepted_store_fingerprints(**args))
        other = accepted_store_fingerprints(**{**args, "partitions": 4})
        with pytest.raises(SnapshotError, match="different topology"):
            open_snapshot(tmp_path / fingerprint[7:15], other)


# ---------------------------------------------------------------- columns cut from stored bytes

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
# Command ids with the characters that could fool a cut: "],", quotes, backslashes, non-ASCII.
command_ids = st.lists(
    st.text(alphabet=st.sampled_from('ab],"\\[ é\n'), max_size=6) | st.uuids().map(str),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.binary(min_size=1, max_size=8),
        st.tuples(json_values, st.integers(-1, 2**62), command_ids),
        min_size=1,
        max_size=30,
    )
)
def test_decoded_columns_match_the_entries_whatever_they_hold(tmp_path_factory, data) -> None:
    directory = tmp_path_factory.mktemp("c")
    values = {k: encode_entry(Entry(s, offset, ids)) for k, (s, offset, ids) in data.items()}
    writer = SnapshotWriter(directory, app_id="a", store="s", fingerprint="f", source="test")
    writer.write_partition(0, sorted(values.items()))
    writer.finish({"topic": "a-commands", "offsets": {0: 1}})
    snap = open_snapshot(directory)
    rows = pq.read_table(snap.path(0)).to_pylist()
    assert [r["key"] for r in rows] == sorted(values)
    for row in rows:
        entry = decode_entry(values[row["key"]])
        assert row["value"] == values[row["key"]]
        assert row["state"] == orjson.dumps(entry.state).decode()
        assert row["last_offset"] == entry.offset
        try:
            assert row["key_text"] == row["key"].decode("utf-8")
        except UnicodeDecodeError:
            assert row["key_text"] is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(json_values, st.integers(-1, 2**62), command_ids), max_size=20))
def test_resetting_input_offsets_is_what_decoding_would_do(entries_) -> None:
    values = [encode_entry(Entry(state, offset, ids)) for state, offset, ids in entries_]
    reset = reset_input_offsets(pa.array(values, pa.binary())).to_pylist()
    expected = []
    for value in values:
        entry = decode_entry(value)
        entry.offset = -1
        expected.append(encode_entry(entry))
    assert reset == expected


def _written_rows(directory: Path, values: dict[bytes, bytes]) -> list[dict]:
    writer = SnapshotWriter(directory, app_id="a", store="s", fingerprint="f", source="t")
    writer.write_partition(0, sorted(values.items()))
    writer.finish(Cut("a-commands", {0: 1}))
    return pq.read_table(open_snapshot(directory).path(0)).to_pylist()


def test_input_offsets_of_every_width_read_as_their_numbers(tmp_path: Path) -> None:
    # One chunk mixing widths: up to 18 digits are read in a grid, 19 by Arrow's parse.
    offsets = [-1, 0, 9, 10, *(10**w - 1 for w in range(2, 19)), 10**18, 2**63 - 1]
    values = {b"k%02d" % i: encode_entry(Entry({"i": i}, o, ["c"])) for i, o in enumerate(offsets)}
    assert [r["last_offset"] for r in _written_rows(tmp_path / "all", values)] == offsets
    narrow = {k: v for k, v in values.items() if decode_entry(v).offset < 10**18}
    rows = _written_rows(tmp_path / "narrow", narrow)
    assert [r["last_offset"] for r in rows] == offsets[:-2]


@pytest.mark.parametrize("offset", [b"007", b"+5", b"-", b"0x1", b"--1"])
def test_a_leading_number_json_would_refuse_is_refused(tmp_path: Path, offset: bytes) -> None:
    good = {f"k{i}".encode(): encode_entry(Entry({"i": i}, i, ["c"])) for i in range(5)}
    bad = {**good, b"k9": b"[" + offset + b',["c"],{"i":9}]'}
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    with pytest.raises(SnapshotError, match=r"k9.*not an Entry envelope"):
        writer.write_partition(0, sorted(bad.items()))


def test_values_in_another_json_layout_are_decoded(tmp_path: Path) -> None:
    spaced = {b"a": b'[ 3 , ["x"] , {"n": 1} ]', b"b": b'[4,["y"],[1, 2]]', b"c": b"[5,[],7]"}
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    writer.write_partition(0, sorted(spaced.items()))
    writer.finish(Cut("a-commands", {0: 6}))
    rows = pq.read_table(open_snapshot(tmp_path / "s").path(0)).to_pylist()
    assert [(r["state"], r["last_offset"]) for r in rows] == [
        ('{"n":1}', 3),
        ("[1,2]", 4),
        ("7", 5),
    ]
    assert [r["value"] for r in rows] == [spaced[k] for k in sorted(spaced)]  # byte for byte


def test_a_long_stream_is_checked_across_chunks(tmp_path: Path) -> None:
    value = encode_entry(Entry({"n": 1}, 1, ["c"]))
    rows = [(f"k{i:07d}".encode(), value) for i in range(150_000)]
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    written = writer.write_partition(0, iter(rows))
    assert written.rows == len(rows)
    writer.finish(Cut("a-commands", {0: 2}))
    snap = open_snapshot(tmp_path / "s")  # the sha256 computed while writing is the file's
    assert [k for k, _ in snap.iter_partition(0)] == [k for k, _ in rows]
    duplicated = rows[:100_000] + rows[99_999:]  # the repeat lands inside a later chunk
    with pytest.raises(SnapshotError, match=r"keys must be unique.*k0099999"):
        SnapshotWriter(
            tmp_path / "d", app_id="a", store="s", fingerprint="f", source="t"
        ).write_partition(0, iter(duplicated))
    assert not list((tmp_path / "d").rglob("*.tmp"))


def test_pairs_of_other_bytes_types_and_null_values(tmp_path: Path) -> None:
    value = encode_entry(Entry(1, 0, []))
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    writer.write_partition(0, [(bytearray(b"a"), memoryview(value)), (b"b", bytearray(value))])
    with pytest.raises(SnapshotError, match="null"):
        writer.write_partition(1, [(b"a", value), (b"b", None)])
    writer.write_partition(1, [])
    writer.finish(Cut("a-commands", {0: 1, 1: 0}))
    assert dict(open_snapshot(tmp_path / "s").iter_partition(0)) == {b"a": value, b"b": value}


def test_a_load_cut_short_leaves_no_rows_and_no_checkpoint(tmp_path: Path) -> None:
    snap = open_snapshot(write_snapshot(tmp_path / "s", entries(300)))

    def stop(partition: int, done: int, total: int) -> None:
        if partition == 1 and done < total:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_into_stores(snap, tmp_path / "state", batch_rows=16, progress=stop)
    store = PartitionStore(tmp_path / "state" / "1")
    try:
        assert list(store.items()) == []
        assert store.input_offset == -1
    finally:
        store.close()
    loaded = load_into_stores(snap, tmp_path / "state", replace=True)
    assert sum(loaded.values()) == 300


def test_an_empty_partition_loads_its_checkpoint(tmp_path: Path) -> None:
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    writer.finish(Cut("a-commands", {0: 5, 1: 0}), partitions=2)
    assert load_into_stores(open_snapshot(tmp_path / "s"), tmp_path / "state") == {0: 0, 1: 0}
    store = PartitionStore(tmp_path / "state" / "0")
    try:
        assert store.input_offset == 4 and list(store.items()) == []
    finally:
        store.close()


def test_a_failing_write_stops_cleanly_wherever_it_fails(tmp_path: Path, monkeypatch) -> None:
    value = encode_entry(Entry({"n": 1}, 1, ["c"]))
    rows = [(f"k{i:07d}".encode(), value) for i in range(70_000)]

    def full_disk(self, data):
        raise OSError("No space left on device")

    monkeypatch.setattr("enhydra.snapshots.format._HashedFile.write", full_disk)
    writer = SnapshotWriter(tmp_path / "s", app_id="a", store="s", fingerprint="f", source="t")
    with pytest.raises(OSError, match="No space left"):
        writer.write_partition(0, iter(rows))
    with pytest.raises(OSError, match="No space left"):  # only the footer is left to write
        writer.write_partition(0, iter(rows[:10]))
    assert not list((tmp_path / "s").rglob("*.tmp"))


def test_an_exclusive_partition_write_keeps_the_first_file_when_two_owners_export(tmp_path):
    """A partition that moves during a live snapshot may be exported by both owners: the
    second write must not replace the file the first one reported."""
    from enhydra.snapshots.format import PartitionTaken, write_partition_file

    first = [(b"a", encode_entry(Entry({"n": 1}, offset=1)))]
    second = [(b"a", encode_entry(Entry({"n": 2}, offset=2))), (b"b", encode_entry(Entry(3)))]
    kept = write_partition_file(tmp_path, "accounts", 0, first, exclusive=True)
    with pytest.raises(PartitionTaken, match="written by another instance first"):
        write_partition_file(tmp_path, "accounts", 0, second, exclusive=True)
    path = tmp_path / kept.file
    assert path.stat().st_size == kept.bytes and kept.rows == 1
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temp file left behind"
