"""A store partition keeps data and checkpoints together across close and reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.runner.changelog_reader import other_history
from enhydra.stores.partition import (
    DEFAULT_MEMORY_MB,
    PartitionStore,
    configure_memory,
    memory_usage,
    record_digest,
)


def test_data_and_checkpoints_survive_reopen(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0")
    assert store.changelog_offset == -1 and store.input_offset == -1
    store.write([(b"a", b"1"), (b"b", b"2")], changelog_offset=10, input_offset=99)
    store.write([(b"a", None)], changelog_offset=11)
    store.close()
    again = PartitionStore(tmp_path / "p0")
    assert again.get(b"a") is None and again.get(b"b") == b"2"
    assert (again.changelog_offset, again.input_offset) == (11, 99)
    assert list(again.items()) == [(b"b", b"2")]
    again.close()


def test_the_last_changelog_record_is_remembered_with_its_offset(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0")
    assert store.last_record is None
    store.write([(b"a", b"1"), (b"b", b"2")], changelog_offset=10)
    store.write([], changelog_offset=12)  # trailing transaction markers: no record to remember
    store.write([(b"c", b"3")])  # a snapshot load: not a changelog record
    store.close()
    again = PartitionStore(tmp_path / "p0")
    assert again.changelog_offset == 12
    assert again.last_record == (10, record_digest(b"b", b"2"))
    again.close()
    assert record_digest(b"b", None) != record_digest(b"b", b"")  # a tombstone is not empty


def test_a_store_from_another_changelog_history_is_recognised() -> None:
    mark = (40, record_digest(b"k7", b"v"))
    # Same history: the record at the store's last offset is the one it wrote.
    assert other_history(40, mark, end=90, found=mark) is None
    # Compaction removed that record, or nothing was read: nothing proves another history.
    assert other_history(40, mark, end=90, found=(44, "ffff")) is None
    assert other_history(40, mark, end=90, found=None) is None
    assert other_history(40, None, end=90, found=None) is None
    # Recreated and grown past the checkpoint: another record sits at that offset.
    found = (40, record_digest(b"k7", b"w"))
    assert other_history(40, mark, end=90, found=found) == (
        "store holds another history of the changelog"
    )
    # Recreated and shorter than the checkpoint.
    assert other_history(40, mark, end=12, found=None) == "store ahead of changelog"
    assert other_history(-1, None, end=0, found=None) is None  # an empty store, an empty log


def test_items_are_in_key_order_from_a_start_key(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p1")
    store.write([(k.encode(), b"v") for k in ["c", "a", "d", "b"]])
    assert [k for k, _ in store.items(b"b")] == [b"b", b"c", b"d"]
    store.close()


@pytest.fixture
def small_budget():
    """An 8 MB budget for one test; the process-wide default comes back afterwards."""
    configure_memory(8)
    yield
    configure_memory(DEFAULT_MEMORY_MB)


@pytest.mark.usefixtures("small_budget")
def test_all_stores_share_one_bounded_memory_budget(tmp_path: Path) -> None:
    """Memtables of every partition count against ENHYDRA_STORE_MEMORY_MB together."""
    stores = [PartitionStore(tmp_path / f"m{i}") for i in range(4)]
    value = bytes(600)
    for round_ in range(60):  # ~58 MB written, far more than the budget
        for store in stores:
            store.write([(b"k%06d" % (round_ * 400 + i), value) for i in range(400)])
    used, limit = memory_usage()
    assert limit == 8 << 20
    # RocksDB flushes when the shared budget fills; use overshoots only while a flush runs.
    assert 0 < used <= limit * 2  # unbounded, it would be ~58 MB
    assert stores[3].get(b"k000000") == value  # flushed data is still there
    for store in stores:
        store.close()


def test_store_memory_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive number of MB"):
        configure_memory(0)


def test_a_bulk_read_leaves_the_shared_block_cache_to_live_reads(tmp_path: Path) -> None:
    """A snapshot reads every block; through the cache it would evict what commands read."""
    store = PartitionStore(tmp_path / "bulk")
    value = bytes(1000)
    for round_ in range(10):  # ~10 MB, in SST files after the reopen
        store.write([(b"k%06d" % (round_ * 1000 + i), value) for i in range(1000)])
    store.close()
    store = PartitionStore(tmp_path / "bulk")
    before, _ = memory_usage()
    assert sum(1 for _ in store.items(bulk=True)) == 10_000
    after_bulk, _ = memory_usage()
    assert sum(1 for _ in store.items()) == 10_000
    after_plain, _ = memory_usage()
    store.close()
    assert after_bulk - before < 256 << 10  # index blocks at most
    assert after_plain - after_bulk > 4 << 20  # what a read through the cache keeps there
